"""`specbook` command line: arguments only; every subcommand calls a module.

Heavy modules (pandas, papermill, the engines) are imported inside the subcommands so that
`specbook --help` answers at once.

Exit codes: 0 ok, 1 a run or an engine failed, 2 bad input (params, paths, names).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from specbook import __version__
from specbook.core.errors import (
    ClientError,
    ExperimentError,
    ModelNotPreparedError,
    ModelPrepareError,
    RunError,
    ServerError,
    SpecbookError,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
# outputs go to the checkout's folder wherever specbook is run from (a -f path from elsewhere included)
OUTPUTS_HELP = ("outputs root (default: $SPECBOOK_OUTPUTS, else the outputs/ folder of the checkout specbook runs "
                "from: $SPECBOOK_ROOT, else the checkout above the current directory, else the one specbook is "
                "installed from; not ./outputs of another directory)")

# Errors that mean "the work failed" rather than "the input is wrong"; looked up along the MRO so
# the most specific class wins (ModelNotPreparedError is a ModelPrepareError but a setup mistake).
EXIT_CODES: dict[type[BaseException], int] = {
    SpecbookError: EXIT_BAD_INPUT,
    RunError: EXIT_FAILED,
    ServerError: EXIT_FAILED,
    ClientError: EXIT_FAILED,
    ModelPrepareError: EXIT_FAILED,
    ModelNotPreparedError: EXIT_BAD_INPUT,
}


def exit_code_for(exc: BaseException) -> int:
    for cls in type(exc).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_FAILED


def _load_experiments() -> None:
    # the package's experiments register themselves when specbook.experiments is imported
    import specbook.experiments  # noqa: F401


def _print_frame(frame) -> None:
    if frame.empty:
        print("(none)")
        return
    import pandas as pd

    with pd.option_context("display.max_columns", None, "display.width", 200, "display.max_colwidth", 80):
        print(frame.to_string(index=False))


# --------------------------------------------------------------------------------------------------
# Subcommands


def cmd_run(args: argparse.Namespace) -> int:
    from specbook.run.runner import resume_experiment, run_experiment

    _load_experiments()
    if args.resume is None and (args.experiment is None or args.params_file is None):
        raise SpecbookError("run: give EXPERIMENT and -f PARAMS, or --resume RUN_DIR")
    if args.resume is not None and (args.params_file is not None or args.outputs is not None):
        raise SpecbookError("run --resume: the params and the folder are the run's own; give a value redacted in "
                            "its params.yaml with -p FIELD=VALUE (no -f, no --outputs)")
    if args.resume is None and (args.allow_params_change or args.allow_git_change or args.allow_hardware_change):
        raise SpecbookError("run: --allow-params-change, --allow-git-change and --allow-hardware-change go with "
                            "--resume")
    if args.no_wait and args.no_lock:
        raise SpecbookError("run: --no-wait waits for no lock that --no-lock does not take; give one of them")
    host_lock = "off" if args.no_lock else "no-wait" if args.no_wait else "wait"
    from specbook.executors import ADDRESS_ENV, KIND_ENV

    # where the units run is no part of the params (a run started locally may resume on Ray): the kernel reads
    # these and the manifest records the cluster used (data/executor.json)
    if args.executor is not None:
        os.environ[KIND_ENV] = args.executor
    if args.ray_address is not None:
        os.environ[KIND_ENV] = os.environ.get(KIND_ENV) or "ray"
        os.environ[ADDRESS_ENV] = args.ray_address
    try:
        if args.resume is not None:
            result = resume_experiment(
                args.resume,
                overrides=args.override,
                experiment=args.experiment,
                allow_params_change=args.allow_params_change,
                allow_git_change=args.allow_git_change,
                allow_hardware_change=args.allow_hardware_change,
                notebook=args.notebook,
                kernel=args.kernel,
                progress=not args.no_progress,
                host_lock=host_lock,
            )
        else:
            result = run_experiment(
                args.experiment,
                args.params_file,
                overrides=args.override,
                outputs_root=args.outputs,
                notebook=args.notebook,
                kernel=args.kernel or "specbook",
                progress=not args.no_progress,
                host_lock=host_lock,
            )
    except RunError as exc:
        result = getattr(exc, "result", None)
        if result is not None:
            print(f"run folder: {result.run_dir}")
            print(f"report: {result.report_html or result.report_ipynb}")
        raise
    print(f"run folder: {result.run_dir}")
    print(f"report: {result.report_html or result.report_ipynb}")
    if result.manifest.render_error:  # the run is ok; only its html is missing
        print(f"warning: {result.manifest.render_error}\n  make the html later with: specbook render {result.run_dir}",
              file=sys.stderr)
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    from specbook.run.runner import render_run

    _load_experiments()
    result = render_run(args.run_dir, notebook=args.notebook, progress=not args.no_progress)
    print(f"run folder: {result.run_dir}")
    print(f"report: {result.report_html}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from specbook.run.runner import list_runs

    frame = list_runs(args.outputs)
    _print_frame(frame.drop(columns=["run_dir"]) if not args.paths else frame)
    return EXIT_OK


def cmd_index(args: argparse.Namespace) -> int:
    from specbook.core.paths import outputs_dir
    from specbook.report.runindex import index_rows, write_index

    root = Path(args.root) if args.root else outputs_dir()
    if not root.is_dir():
        raise SpecbookError(f"{root}: no such folder")
    out = write_index(root)
    print(f"{len(index_rows(root))} run(s) listed in {out}")
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from specbook.report.rundiff import diff_html, diff_runs, diff_text

    d = diff_runs(args.run_a, args.run_b)
    print(diff_text(d), end="")
    if args.html:
        Path(args.html).write_text(diff_html(d), encoding="utf-8")
        print(f"html: {args.html}")
    return EXIT_OK


def infer_experiment(params_file: str | Path) -> str:
    """params/<experiment>/<name>.yaml -> <experiment>."""
    return Path(params_file).resolve().parent.name


def cmd_check(args: argparse.Namespace) -> int:
    from specbook.core.params import display_path, load_params, params_hash
    from specbook.experiments.registry import get_experiment

    _load_experiments()
    experiment = args.experiment or infer_experiment(args.params_file)
    try:
        spec = get_experiment(experiment)
    except ExperimentError as exc:
        if args.experiment:
            raise
        raise ExperimentError(
            f"{exc} (inferred from the folder of {display_path(args.params_file)}; pass --experiment NAME)"
        ) from None
    params = load_params(spec.params_model, args.params_file, args.override)
    params.check_inputs()  # every path it names, as `run` checks before it makes a folder
    print(
        f"ok: {display_path(args.params_file)} is valid params for {experiment} (hash {params_hash(params)[:12]})"
    )
    return EXIT_OK


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from specbook.models import prepare_models

    paths = prepare_models(
        names=args.only or None,
        force=args.force,
        gguf=Path(args.gguf) if args.gguf else None,
        verify_only=args.verify_only,
    )
    for name, path in paths.items():
        print(f"{name}: {path}")
    return EXIT_OK


def cmd_ingest(args: argparse.Namespace) -> int:
    from specbook.ingest import ingest_files

    records = ingest_files([Path(f) for f in args.files])
    if args.json:
        for rec in records:
            print(json.dumps(rec, default=str, sort_keys=False))
        return EXIT_OK
    import pandas as pd

    _print_frame(pd.json_normalize(records))
    return EXIT_OK


# --------------------------------------------------------------------------------------------------
# Parser


OVERRIDE_HELP = "override a param: dotted key with list indices, YAML value (e.g. arms.0.env.X=1); repeatable"
# argparse names no public type for what add_subparsers returns
Subparsers = argparse._SubParsersAction


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specbook",
        description="A reproducible experiment book for speculative-decoding serving engineers.",
    )
    parser.add_argument("--version", action="version", version=f"specbook {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in (_add_run, _add_list, _add_render, _add_index, _add_diff, _add_check, _add_models,
                        _add_ingest):
        add_command(sub)
    return parser


def _command(sub: Subparsers, name: str, func: Callable[[argparse.Namespace], int],
             help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=help_)
    p.set_defaults(func=func)
    return p


def _add_override(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-p", "--param", dest="override", action="append", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP
    )


def _add_run(sub: Subparsers) -> None:
    p = _command(sub, "run", cmd_run, "run an experiment: start its servers, execute its notebook, render the report")
    p.add_argument("experiment", nargs="?", default=None,
                   help="experiment name (see params/<experiment>/); optional with --resume")
    p.add_argument("-f", "--params", dest="params_file", default=None, help="params YAML file")
    _add_override(p)
    p.add_argument("--outputs", default=None, help=OUTPUTS_HELP)
    p.add_argument("--notebook", default=None, help="run this notebook instead of the experiment's own")
    p.add_argument("--no-wait", action="store_true",
                   help="refuse to start, naming the holder, while another run holds the host lock (default: wait "
                        "for it; $SPECBOOK_HOST_LOCK, default /tmp/specbook-host.lock)")
    p.add_argument("--no-lock", action="store_true",
                   help="run without the host lock, beside other runs (recorded in the manifest; each window's "
                        "host load still is)")
    p.add_argument("--kernel", default=None, help="Jupyter kernel name (default: specbook, or the resumed run's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue an abandoned, failed or interrupted run in its folder: finished units are kept, "
                        "the rest run (-p gives again a value its params.yaml has redacted)")
    p.add_argument("--allow-params-change", action="store_true",
                   help="with --resume: resume although the params differ (recorded in the manifest)")
    p.add_argument("--allow-git-change", action="store_true",
                   help="with --resume: resume with a different git commit (recorded in the manifest)")
    p.add_argument("--allow-hardware-change", action="store_true",
                   help="with --resume: resume on another kind of machine (GPU model or count, or CPU) than the "
                        "run's first part (recorded in the manifest; the report says so)")
    p.add_argument("--executor", choices=["local", "ray"], default=None,
                   help="where the units run, over the params' executor.kind: local (one after another) or ray "
                        "(Ray tasks over the cluster's GPUs)")
    p.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="join this Ray cluster ('auto', 'ray://HEAD:10001'); implies --executor ray")


def _add_list(sub: Subparsers) -> None:
    p = _command(sub, "list", cmd_list, "list run folders with their status")
    p.add_argument("--outputs", default=None, help=OUTPUTS_HELP)
    p.add_argument("--paths", action="store_true", help="show each run folder's path")


def _add_render(sub: Subparsers) -> None:
    p = _command(
        sub, "render", cmd_render, "re-execute a run's notebook on its saved data (no server) and re-render it"
    )
    p.add_argument("run_dir", help="the run folder")
    p.add_argument("--notebook", default=None, help="render with this notebook instead of the run's own")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _add_index(sub: Subparsers) -> None:
    p = _command(sub, "index", cmd_index, "write ROOT/index.html listing every run under ROOT (default: outputs/)")
    p.add_argument("--root", default=None, help="folder of runs, e.g. docs/reports (default: as --outputs of run)")


def _add_diff(sub: Subparsers) -> None:
    p = _command(sub, "diff", cmd_diff,
                 "two runs of one experiment side by side: params, environment, headline verdicts")
    p.add_argument("run_a", help="a run folder")
    p.add_argument("run_b", help="another run folder of the same experiment")
    p.add_argument("--html", default=None, metavar="PATH", help="also write the diff as an HTML page")


def _add_check(sub: Subparsers) -> None:
    p = _command(sub, "check", cmd_check, "validate a params file without running anything")
    p.add_argument("params_file", help="params YAML file")
    p.add_argument(
        "--experiment", default=None, help="experiment name (default: the params file's folder name)"
    )
    _add_override(p)


def _add_models(sub: Subparsers) -> None:
    models = sub.add_parser("models", help="embedded models", description="embedded models")
    models_sub = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    p = models_sub.add_parser(
        "prepare",
        help="prepare the embedded target and draft models (idempotent)",
        description="prepare the embedded target and draft models (idempotent)",
    )
    p.set_defaults(func=cmd_models_prepare)
    p.add_argument("--force", action="store_true", help="rebuild even if present and verified")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="prepare only these models")
    p.add_argument("--gguf", default=None, metavar="PATH", help="use this local GGUF of the target")
    p.add_argument("--verify-only", action="store_true", help="re-hash the prepared models, make nothing")


def _add_ingest(sub: Subparsers) -> None:
    p = _command(sub, "ingest", cmd_ingest, "parse engine server logs or vLLM bench results into acceptance figures")
    p.add_argument("files", nargs="+", metavar="PATH",
                   help="server log files, `vllm bench serve --save-result` files, `vllm bench sweep serve` folders")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")


def _log_to_stderr() -> None:
    # the runner logs the run folder as soon as it exists, so an interrupted run can be found
    logger = logging.getLogger("specbook")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _log_to_stderr()
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe is met here, not in the interpreter's last flush
        return code
    except SpecbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specbook ingest ... --json | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
