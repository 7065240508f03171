"""Reading the rows of a data file a user brings: JSONL, JSON, CSV, Parquet, or a saved HF dataset.

`read_rows(path, fmt)` returns the file's rows as plain dicts (str keys, JSON-plain
values), in file order, or raises ValueError naming the file and what is wrong
with it (not there, empty, not that format, a CSV field over the csv module's
128 KiB, values nested deeper than MAX_DEPTH). Parquet and HF dataset folders
(`datasets.Dataset.save_to_disk`: Arrow stream files listed in state.json, which
must lie inside the folder) are read with pyarrow, so `datasets` itself is not needed.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

MAX_DEPTH = 100  # nested lists and objects in a value (Python's recursion limit is 1000)
FORMATS = ("auto", "jsonl", "json", "csv", "parquet", "hf")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def read_rows(path: str | Path, fmt: str = "auto", key: str = "task.params.path") -> list[dict[str, Any]]:
    """The rows of the data file at `path` (config key `key`) in format `fmt` ("auto": by suffix,
    or "hf" for a folder)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(
            f"{key}={str(path)!r}: no such file or folder (relative paths are from "
            f"{Path.cwd()}); give the path of a .jsonl, .json, .csv or .parquet file or a "
            f"folder saved by datasets' save_to_disk"
        )
    fmt = _format(path, fmt, key)
    try:
        rows = _READERS[fmt](path)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{key}={str(path)!r}: cannot read it as {fmt}: {e}") from None
    except csv.Error as e:  # e.g. a field over 128 KiB: long texts read better as JSONL or Parquet
        raise ValueError(f"{key}={str(path)!r}: cannot read it as csv: {e} (use JSONL or Parquet)") from None
    if not rows:
        raise ValueError(f"{key}={str(path)!r} holds no rows; it must hold at least one item")
    return [_plain_row(row, path, i) for i, row in enumerate(rows)]


def _format(path: Path, fmt: str, key: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"task.params.format={fmt!r}: one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "hf"
    if path.suffix.lower() in _SUFFIXES:
        return _SUFFIXES[path.suffix.lower()]
    raise ValueError(
        f"{key}={str(path)!r}: cannot tell the format from the suffix {path.suffix!r}; name it "
        f"with task.params.format (one of {', '.join(FORMATS[1:])})"
    )


def _jsonl(path: Path) -> list:
    rows = []
    with path.open(encoding="utf-8-sig") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                rows.append(_json_value(line, path, f"line {number}"))
    return rows


def _json(path: Path) -> list:
    data = _json_value(path.read_text(encoding="utf-8-sig"), path, "the file")
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: a .json data file must hold a list of objects, not a {type(data).__name__} "
            f"(for one object per line, name the file .jsonl)"
        )
    return data


def _json_value(text: str, path: Path, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: {where} is not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: {where} nests lists or objects too deeply to read") from None


def _csv(path: Path) -> list:
    with path.open(encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise ValueError(
            "reading Parquet files and HF dataset folders needs pyarrow: pip install pyarrow "
            "(scripts/setup.sh installs it)"
        ) from None
    return pyarrow


def _parquet(path: Path) -> list:
    return _pyarrow().parquet.read_table(path).to_pylist()


def _hf_folder(path: Path) -> list:
    """A folder written by `datasets.Dataset.save_to_disk`: state.json lists its Arrow stream files."""
    pa = _pyarrow()
    if (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise ValueError(
            f"{path} holds a DatasetDict with splits {splits}: point task.params.path at one split's "
            f"folder (e.g. {path / (splits[0] if splits else 'train')}) and, for a held-out split, "
            f"task.params.eval_path at another"
        )
    if not (path / "state.json").exists():
        raise ValueError(f"{path} is a folder but not one saved by datasets' save_to_disk (no state.json)")
    state = _json_value((path / "state.json").read_text(), path / "state.json", "the file")
    rows = []
    for name in _data_files(state, path):
        with pa.memory_map(str(path / name)) as source:
            rows += pa.ipc.open_stream(source).read_all().to_pylist()
    return rows


def _data_files(state: Any, path: Path) -> list[str]:
    """The Arrow files state.json lists, each a file name inside the folder (never `../x` or `/x`)."""
    entries = state.get("_data_files", []) if isinstance(state, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "filename" in e for e in entries):
        raise ValueError(f"{path / 'state.json'}: _data_files is not a list of {{'filename': ...}} entries")
    names = [entry["filename"] for entry in entries]
    for name in names:
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(
                f"{path / 'state.json'}: _data_files names {name!r}; the files of a saved dataset lie in its folder"
            )
    return names


_READERS = {"jsonl": _jsonl, "json": _json, "csv": _csv, "parquet": _parquet, "hf": _hf_folder}


def _plain_row(row: Any, path: Path, index: int) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"{path}: item {index} is a {type(row).__name__}, not an object with named fields")
    try:
        return {str(k): _plain(v, 1) for k, v in row.items()}
    except _TooDeep:
        raise ValueError(f"{path}: item {index} nests lists or objects more than {MAX_DEPTH} deep") from None


class _TooDeep(Exception):
    pass


def _plain(value: Any, depth: int) -> Any:
    """A value as JSON-plain data (Parquet dates, decimals and bytes become strings)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (dict, list, tuple)) and depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    return str(value)
