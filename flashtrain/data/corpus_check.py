"""Local corpus files that `datasets` failed to read: which file, which line, what is wrong.

`datasets`' own failure on a truncated `.jsonl`, or on files whose fields differ, is a long
traceback (DatasetGenerationError over an Arrow parse or cast error) that names no file. Only
once it has failed are the files read again here, with the standard library's parsers (and
pyarrow's for parquet), to find the first problem: a line that is not a JSON object, a CSV row
cut short, a file whose fields (or a field's kind of value) differ from the corpus's first file.
The result is one ConfigError line (a user error: exit 2 in train.py and prepare_data.py); what
these checks do not recognise is still one line, naming the files and `datasets`' own reason.
"""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Iterator

from flashtrain.no_space import no_space_errno
from flashtrain.typed_config import ConfigError

_FIX = "fix or remove that line, or remove the file from"


@contextlib.contextmanager
def read_errors_explained(files: list[str], key: str, builder: str):
    """Around `datasets` reading `files` (listed by config key `key`, e.g. data.data_files) with
    its packaged `builder` (text / json / csv / parquet), loading or iterating: a failure to
    read them becomes one ConfigError line naming the file and where in it."""
    from datasets.exceptions import DatasetsError

    try:
        yield
    except (DatasetsError, ValueError) as e:  # Arrow, pandas and json parse errors: ValueErrors
        if isinstance(e, ConfigError) or no_space_errno(e) is not None:
            raise  # a full disk under the cache is no fault of the files (train.py: exit 4)
        raise ConfigError(describe_unreadable(files, key, builder, e)) from e


def describe_unreadable(files: list[str], key: str, builder: str, error: BaseException) -> str:
    """The one line for `files` that `datasets` could not read (`error`: its exception)."""
    check = {"json": _json_problem, "csv": _csv_problem, "parquet": _parquet_problem}.get(builder)
    problem = check(files, key) if check else None
    if problem:
        return problem
    root = error
    while root.__cause__ is not None:  # DatasetGenerationError's cause is the parser's error
        root = root.__cause__
    lines = str(root).strip().splitlines()
    reason = f"{type(root).__name__}: {lines[0] if lines else ''}"
    named = ", ".join(files) if len(files) <= 3 else f"{files[0]} and {len(files) - 1} more"
    return f"{key}: `datasets` could not read {named} ({builder} files): {reason}"


class _Unreadable(Exception):
    """A problem found while reading a file again: its message is the one line."""


def _json_problem(files: list[str], key: str) -> str | None:
    """A line that is not a JSON object, else the first file whose fields, or the kind of value
    of a field, differ from what the files before it hold (`datasets` reads them as one table)."""
    kinds: dict[str, tuple[str, str]] = {}  # field -> (JSON kind of its first value, where)
    first_file, first_fields = None, None
    try:
        for path in files:
            file_fields: set[str] = set()
            for where, record in _json_records(path, key):
                if not isinstance(record, dict):
                    kind = _json_kind(record)
                    return f"{key}: {path} {where} is a JSON {kind}, not an object; {_FIX} {key}"
                file_fields.update(record)
                for name, value in record.items():
                    kind = _json_kind(value)
                    if kind == "null":
                        continue
                    first_kind, first_where = kinds.setdefault(name, (kind, f"{path} {where}"))
                    if kind != first_kind:
                        return (
                            f"{key}: {path} {where}: field '{name}' holds a {kind} where "
                            f"{first_where} holds a {first_kind}; give a field one kind of "
                            "value in every file (a corpus is read as one table)"
                        )
            if first_fields is None:
                first_file, first_fields = path, file_fields
            elif file_fields != first_fields:
                return (
                    f"{key}: {path} has the fields {sorted(file_fields)} but {first_file} has "
                    f"{sorted(first_fields)}; every file of a corpus needs the same fields (it "
                    f"is read as one table): make them match, or list only files that share "
                    f"them in {key}"
                )
    except _Unreadable as e:
        return str(e)
    return None


def _json_records(path: str, key: str) -> Iterator[tuple[str, object]]:
    """("line N" or "record N", value) of a JSON-lines file, or of a whole JSON array of
    records (the two layouts `datasets`' json builder reads); a parse error is _Unreadable."""
    with open(path, encoding="utf-8") as f:
        first = f.read(1 << 16).lstrip()[:1]
    if first == "[":
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise _Unreadable(
                f"{key}: {path} is not JSON: line {e.lineno} column {e.colno}: {e.msg} (a "
                f"truncated or damaged file?); fix it, or remove the file from {key}"
            ) from None
        yield from ((f"record {i}", record) for i, record in enumerate(records, start=1))
        return
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                yield f"line {number}", json.loads(text)
            except json.JSONDecodeError as e:
                cut = " (the file ends inside it: truncated?)" if not text.endswith("\n") else ""
                raise _Unreadable(
                    f"{key}: {path} line {number} is not JSON ({e.msg} at column {e.colno})"
                    f"{cut}; {_FIX} {key}"
                ) from None


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}[type(value)]


def _csv_problem(files: list[str], key: str) -> str | None:
    """A row that is cut short (an unclosed quote) or has another number of fields than its
    header, else the first file whose header differs from the first file's."""
    first_file, first_header = None, None
    for path in files:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, strict=True)
            header = None
            while True:
                start = reader.line_num + 1  # the line the next row starts on
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:
                    return f"{key}: {path} line {start} is not CSV ({e}); {_FIX} {key}"
                if header is None:
                    header = row
                elif row and len(row) != len(header):
                    return (
                        f"{key}: {path} line {start} has {len(row)} fields where its header has "
                        f"{len(header)}; {_FIX} {key}"
                    )
        if first_header is None:
            first_file, first_header = path, header
        elif header != first_header:
            return (
                f"{key}: {path} has the columns {header} but {first_file} has {first_header}; "
                f"every file of a corpus needs the same columns: make them match, or list only "
                f"files that share them in {key}"
            )
    return None


def _parquet_problem(files: list[str], key: str) -> str | None:
    """A file pyarrow cannot read as parquet, else the first whose columns differ."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first_file, first_schema = None, None
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowException, OSError) as e:
            return f"{key}: {path} is not a readable parquet file ({e}); fix it or remove it from {key}"
        if first_schema is None:
            first_file, first_schema = path, schema
        elif schema.names != first_schema.names:
            return (
                f"{key}: {path} has the columns {schema.names} but {first_file} has "
                f"{first_schema.names}; every file of a corpus needs the same columns"
            )
    return None
