"""Write one self-contained HTML page that shows the traces of a traces.jsonl.

    python scripts/view_traces.py /tmp/traces.jsonl -o /tmp/traces.html --model tiny
    python scripts/view_traces.py traces.jsonl --model /path/to/hf/folder --limit 20

Every sequence by agent, its prompt / trained / masked tokens in different
colours, the training rows its turns merge into, versions, rewards, errors,
info (rendering: rollout/viewer.py). The page has inline CSS only and loads
nothing from anywhere: open it from disk, mail it, attach it to an issue.
`--model` names the tokenizer that decodes the token ids: a built-in model
(tiny, tiny_tied, smollm2_135m) or a local HF model folder.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from rollout.log import setup_logging
from rollout.models import BUILTIN_MODELS, resolve_model
from rollout.trace import TraceError, read_jsonl
from rollout.viewer import build_view, load_decode, render_page


def _run_dir_model(traces: Path) -> str | None:
    """The model a run dir's config.yaml names, if the traces file sits in one (just a hint)."""
    config = traces.parent / "config.yaml"
    if not config.is_file():
        return None
    import yaml

    try:
        cfg = yaml.safe_load(config.read_text())
    except yaml.YAMLError:  # an unreadable config only costs the hint
        return None
    model = cfg.get("model") if isinstance(cfg, dict) else None
    return (model.get("path") or model.get("name")) if isinstance(model, dict) else None


def tokenizer_path(model: str | None, traces: Path, parser: argparse.ArgumentParser) -> str:
    if model is None:
        hint = _run_dir_model(traces)
        where = (
            f"{traces.parent} looks like a run dir (config.yaml names model {hint!r}); "
            f"pass it explicitly, e.g. --model {hint}"
            if hint
            else "e.g. --model tiny, or --model /path/to/hf/model"
        )
        parser.error(f"--model is required: the tokenizer that decodes the token ids ({where})")
    if model in BUILTIN_MODELS:
        return resolve_model(model)
    folder = Path(model).expanduser()
    if not folder.is_dir():
        parser.error(f"--model {model!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a folder")
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        parser.error(f"--model {model!r}: no tokenizer.json / tokenizer_config.json in that folder")
    return str(folder)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path, help="a traces.jsonl (scripts/generate.py out=...)")
    parser.add_argument("-o", "--out", type=Path, help="the HTML file to write (default: beside the traces)")
    parser.add_argument("--model", help="tokenizer: a built-in model name or a local HF model folder")
    parser.add_argument("--limit", type=int, help="show only the first N traces")
    args = parser.parse_args(argv)
    if not args.traces.is_file():
        parser.error(f"traces file {str(args.traces)!r} does not exist")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit {args.limit}: must be at least 1")
    decode = load_decode(tokenizer_path(args.model, args.traces, parser))

    with open(args.traces) as f:
        total = sum(1 for line in f if line.strip())
    try:
        traces = list(itertools.islice(read_jsonl(args.traces), args.limit))
    except TraceError as e:
        sys.exit(f"view_traces: malformed traces file: {e}")
    if not traces:
        sys.exit(f"view_traces: {args.traces} holds no traces")

    out = args.out or args.traces.with_suffix(".html")
    shown = f"{len(traces)} of {total} traces" if len(traces) < total else f"{total} traces"
    page = render_page(
        [build_view(t, decode) for t in traces],
        title=f"Traces: {args.traces.name}",
        subtitle=f"{shown} · {args.traces.resolve()} · tokenizer {args.model}",
    )
    out.write_text(page, encoding="utf-8")
    print(f"[view] wrote {out} ({shown}, {len(page) / 1024:.0f} KiB)")


if __name__ == "__main__":
    setup_logging()  # tracerl's lines on stderr, one format (TRACERL_LOG_LEVEL)
    main()
