"""report.html from an executed report.ipynb: inputs hidden, a table of contents, nothing fetched from the net.

A failed html step is the report's state, never the run's: the manifest records it (`report_status`,
`render_error`) and `specbook render` makes the html later.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from specbook.core.diskwrite import write_text_atomic
from specbook.run.execute import REPORT_IPYNB
from specbook.store.manifest import Manifest

__all__ = ["REPORT_HTML", "offline_html", "record_report", "render_html", "try_render"]

REPORT_HTML = "report.html"

_EMPTY_SCRIPT = re.compile(r'<script[^>]*\ssrc=""[^>]*>\s*</script>\s*')
# nbconvert's loader that imports mermaid.js from a CDN when a page holds a mermaid diagram: no report holds one,
# and a report names no URL it could fetch
_MERMAID_LOADER = re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*</script>\s*',
                             re.DOTALL)


def offline_html(body: str) -> str:
    """A rendered report without nbconvert's script tags that load nothing and without its CDN mermaid loader."""
    return _MERMAID_LOADER.sub("", _EMPTY_SCRIPT.sub("", body))


def render_html(report_ipynb: str | os.PathLike[str], title: str | None = None) -> Path:
    """report.html beside the notebook, inputs hidden: the report shows results, not code."""
    import nbformat
    from nbconvert import HTMLExporter

    from specbook.report import view as report_view

    src = Path(report_ipynb)
    # No MathJax or require.js from a CDN: a report must read offline (none uses math or JS widgets).
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True,
                            mathjax_url="", require_js_url="")
    # from_filename would overwrite the title with the file name ("report")
    resources = {"metadata": {"name": title or src.stem, "path": str(src.parent)}}
    body, _ = exporter.from_notebook_node(nbformat.read(src, as_version=4), resources=resources)
    # every report, whatever its experiment, gets its table of contents here, once
    return write_text_atomic(src.with_suffix(".html"), report_view.with_toc(offline_html(body)))


def try_render(run_dir: Path, title: str) -> tuple[Path | None, str | None]:
    """(report.html, None), or (None, why the html step failed); (None, None) when no report.ipynb exists."""
    report = run_dir / REPORT_IPYNB
    if not report.exists():
        return None, None
    try:
        return render_html(report, title), None
    except Exception as exc:  # a render failure must not hide the run's own status
        hint = ""
        if "No template sub-directory" in str(exc):  # seen on a GPU host with nbconvert installed by pip --target
            hint = (" (nbconvert's templates are not on the Jupyter data path; where nbconvert was installed with "
                    "`pip install --target DIR`, add DIR/share/jupyter to JUPYTER_PATH; the executed report.ipynb "
                    "is kept: `specbook render RUN_DIR` makes the html later)")
        return None, f"html render failed: {type(exc).__name__}: {exc}{hint}"


def record_report(manifest: Manifest, html: Path | None, render_error: str | None) -> None:
    """Whether report.html exists now; a failed html step is the report's state, never the run's status."""
    manifest.report_status = "ok" if html is not None else ("failed" if render_error else None)
    manifest.render_error = render_error
