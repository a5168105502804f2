"""`python -m specbook` is the `specbook` command."""

from specbook.cli import main

raise SystemExit(main())
