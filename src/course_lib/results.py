"""Recorded measurements: a JSON record format with mandatory provenance.

A record holds what an experiment measured on real hardware (``values``), how it was asked
(``parameters``), and where and how it ran (``provenance``: device name, compute capability, torch and CUDA
versions, date, the exact command, git commit). Loading validates the provenance and refuses a record
that lacks any of it. A raw log may sit beside the record (``log_file``, a path relative to the record).

Records are only ever written by :mod:`course_lib.record` from a real run; nothing here invents one.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import torch

from .device import describe_hardware
from .jsonable import from_jsonable, to_jsonable  # noqa: F401  (the one JSON conversion, beside the records)

# version 2 (this one): values hold {"result": to_jsonable(result)}; version 1 held hand-made values
SCHEMA_VERSION = 2
RESULTS_ENV_VAR = "COURSE_RESULTS_DIR"
GIT_COMMIT_ENV_VAR = "COURSE_GIT_COMMIT"

REQUIRED_PROVENANCE = ("device_name", "device_type", "torch_version", "date", "command", "git_commit",
                       "python_version")
OPTIONAL_PROVENANCE = ("compute_capability", "cuda_version", "hostname")
# the device types a record can come from: what course_lib.device.describe_hardware reports
DEVICE_TYPES = ("cuda", "cpu")


class RecordError(ValueError):
    """A record file is malformed or lacks provenance."""


@dataclass(frozen=True)
class Provenance:
    """Where and how a measurement was taken. ``compute_capability``/``cuda_version`` are None on CPU."""

    device_name: str
    device_type: str
    torch_version: str
    date: str                 # ISO 8601, UTC
    command: str              # the exact command line that produced the record
    git_commit: str           # the course commit that ran (or what the caller passed in)
    python_version: str
    compute_capability: str | None = None
    cuda_version: str | None = None
    hostname: str | None = None


@dataclass(frozen=True)
class Record:
    """One experiment's recorded result."""

    experiment: str
    parameters: dict[str, Any]
    values: dict[str, Any]
    provenance: Provenance
    log_file: str | None = None
    schema_version: int = SCHEMA_VERSION
    path: Path | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        """Short hardware label for a figure legend or table column, e.g. ``"NVIDIA H200 (sm 9.0)"``."""
        p = self.provenance
        cc = f" (sm {p.compute_capability})" if p.compute_capability else ""
        return f"{p.device_name}{cc}"

    @property
    def course_model(self) -> dict[str, Any] | None:
        """The course model's shape and batch at the record's profile: stored with it, or for a full-size
        record made before they were stored, :data:`EARLIER_FULL_MODEL`; None when neither says, and for an
        experiment of :data:`NO_COURSE_MODEL`."""
        stored = self.parameters.get("course_model")
        if stored is not None or self.experiment in NO_COURSE_MODEL:
            return stored
        full = self.parameters.get("size", self.parameters.get("profile")) == "full"
        return dict(EARLIER_FULL_MODEL) if full else None

    @property
    def earlier_full_model(self) -> bool:
        """Whether the record trained the full profile's course model as it was before
        :data:`EARLIER_FULL_UNTIL` (:data:`EARLIER_FULL_MODEL`, narrower than today's)."""
        return self.course_model is not None and "course_model" not in self.parameters


@dataclass(frozen=True)
class RecordedResult:
    """A record and the result it holds, read back into its experiment's result type
    (``course_lib.experiments.recorded_results`` makes them); ``label`` and ``provenance`` are the record's,
    so :func:`describe_records` takes these as it takes records."""

    record: Record
    result: Any

    @property
    def label(self) -> str:
        return self.record.label

    @property
    def provenance(self) -> Provenance:
        return self.record.provenance


def source_commit() -> str:
    """The git commit of the course's source this code runs from (``+dirty`` with uncommitted changes to
    tracked files), from ``COURSE_GIT_COMMIT`` when set, else "unknown" outside a git checkout."""
    env = os.environ.get(GIT_COMMIT_ENV_VAR)
    if env:
        return env.strip()
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        if out.returncode == 0 and out.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10,
                                   cwd=Path(__file__).resolve().parent)
            return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def capture_provenance(command: str, device: torch.device | str | None = None) -> Provenance:
    """Provenance of a run happening now on ``device`` (default: the course's selected device).

    ``command`` is the exact command line; the git commit comes from ``COURSE_GIT_COMMIT`` when set
    (for machines that receive a copy of the tree without ``.git``), else from ``git rev-parse``.
    """
    if not isinstance(command, str) or not command.strip():
        raise ValueError("provenance needs the exact command that ran, as a non-empty string")
    hw = describe_hardware(device)
    return Provenance(
        device_name=hw.name,
        device_type=hw.device_type,
        torch_version=torch.__version__,
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        command=command,
        git_commit=source_commit(),
        python_version=platform.python_version(),
        compute_capability=hw.compute_capability,
        cuda_version=hw.cuda_version if hw.device_type == "cuda" else None,
        hostname=platform.node() or None,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "device"


def record_filename(record: Record) -> str:
    """``<experiment>__<device>__<YYYYmmddTHHMMSS>.json``."""
    stamp = re.sub(r"[^0-9T]", "", record.provenance.date.split("+")[0])
    return f"{record.experiment}__{_slug(record.provenance.device_name)}__{stamp}.json"


def save_record(record: Record, out_dir: str | Path, *, log_text: str | None = None) -> Path:
    """Write ``record`` as JSON under ``out_dir`` (and its raw log beside it); return the JSON path."""
    _validate_record_dict(_record_to_dict(record), source="record to save")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / record_filename(record)
    if log_text is not None:
        log_path = path.with_suffix(".log")
        log_path.write_text(log_text, encoding="utf-8")
        record = dataclasses.replace(record, log_file=log_path.name)
    path.write_text(json.dumps(_record_to_dict(record), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _record_to_dict(record: Record) -> dict[str, Any]:
    return {
        "schema_version": record.schema_version,
        "experiment": record.experiment,
        "parameters": to_jsonable(record.parameters),
        "values": to_jsonable(record.values),
        "provenance": to_jsonable(record.provenance),
        "log_file": record.log_file,
    }


def _validate_record_dict(data: Any, *, source: str) -> None:
    if not isinstance(data, dict):
        raise RecordError(f"{source}: a record is a JSON object, got {type(data).__name__}")
    for key in ("experiment", "parameters", "values", "provenance"):
        if key not in data:
            raise RecordError(f"{source}: record lacks '{key}'")
    if not isinstance(data["experiment"], str) or not data["experiment"]:
        raise RecordError(f"{source}: 'experiment' must be a non-empty string")
    for key in ("parameters", "values", "provenance"):
        if not isinstance(data[key], dict):
            raise RecordError(f"{source}: '{key}' must be an object")
    prov = data["provenance"]
    missing = [k for k in REQUIRED_PROVENANCE if prov.get(k) is None]
    if missing:
        raise RecordError(f"{source}: provenance lacks {', '.join(missing)}; a record without its "
                          "provenance cannot be shown as a measurement")
    for k in REQUIRED_PROVENANCE:
        if not isinstance(prov[k], str) or not prov[k].strip():
            raise RecordError(f"{source}: provenance {k} must be a non-empty string, got {prov[k]!r}")
    for k in OPTIONAL_PROVENANCE:
        if prov.get(k) is not None and (not isinstance(prov[k], str) or not prov[k].strip()):
            raise RecordError(f"{source}: provenance {k} must be a non-empty string or null, got {prov[k]!r}")
    device_type = prov["device_type"]
    if device_type not in DEVICE_TYPES:
        raise RecordError(f"{source}: provenance device_type {device_type!r} is not one the course records "
                          f"({' or '.join(map(repr, DEVICE_TYPES))})")
    if device_type == "cuda":
        lacking = [k for k in ("compute_capability", "cuda_version") if not prov.get(k)]
        if lacking:
            raise RecordError(f"{source}: a GPU record must give {', '.join(lacking)}")
        if not re.fullmatch(r"\d+\.\d+", prov["compute_capability"]):
            raise RecordError(f"{source}: provenance compute_capability {prov['compute_capability']!r} is not "
                              "'major.minor' (such as '9.0')")
    else:
        given = [k for k in ("compute_capability", "cuda_version") if prov.get(k) is not None]
        if given:
            raise RecordError(f"{source}: a {device_type} record gives {', '.join(given)} "
                              f"({', '.join(repr(prov[k]) for k in given)}), which only a GPU record has")
    try:
        date = _dt.datetime.fromisoformat(prov["date"])
    except ValueError:
        raise RecordError(f"{source}: provenance date {prov['date']!r} is not ISO 8601") from None
    if date.utcoffset() != _dt.timedelta(0):
        raise RecordError(f"{source}: provenance date {prov['date']!r} is not in UTC (a date and time with the "
                          "offset +00:00, as capture_provenance writes it)")
    if data.get("log_file") is not None and (not isinstance(data["log_file"], str) or not data["log_file"]):
        raise RecordError(f"{source}: 'log_file' must be a file name (a non-empty string) or null, got "
                          f"{data['log_file']!r}")


def _from_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _from_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_jsonable(v) for v in obj]
    if obj == "nan":
        return math.nan
    if obj == "inf":
        return math.inf
    if obj == "-inf":
        return -math.inf
    return obj


def _schema_version(data: dict, path: Path) -> int:
    value = data.get("schema_version", SCHEMA_VERSION)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{path}: field 'schema_version' must be an int, got {value!r}")
    return value


def load_record(path: str | Path) -> Record:
    """Read and validate one record; raise :class:`RecordError` naming what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON ({exc})") from None
    _validate_record_dict(data, source=str(path))
    prov_fields = {f.name for f in dataclasses.fields(Provenance)}
    prov = Provenance(**{k: v for k, v in data["provenance"].items() if k in prov_fields})
    if data.get("log_file") and not (path.parent / data["log_file"]).is_file():
        raise RecordError(f"{path}: its raw log {data['log_file']!r} is missing")
    return Record(
        experiment=data["experiment"],
        parameters=_from_jsonable(data["parameters"]),
        values=_from_jsonable(data["values"]),
        provenance=prov,
        log_file=data.get("log_file"),
        schema_version=_schema_version(data, path),
        path=path,
    )


def default_results_dir() -> Path:
    """``$COURSE_RESULTS_DIR``, else the ``results/`` folder of the course checkout around the cwd."""
    env = os.environ.get(RESULTS_ENV_VAR)
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "_config.yml").is_file() and (folder / "results").is_dir():
            return folder / "results"
    package_root = Path(__file__).resolve().parents[2]
    return package_root / "results"


def load_records(experiment: str | None = None, results_dir: str | Path | None = None,
                 *, device_type: str | None = None) -> list[Record]:
    """All valid records under ``results_dir`` (default :func:`default_results_dir`), newest first.

    Filters by experiment name and device type (``"cuda"``/``"cpu"``) when given. A malformed record
    raises :class:`RecordError` rather than being skipped: a broken measurement must be noticed.
    """
    if device_type is not None and device_type not in DEVICE_TYPES:
        raise ValueError(f"device_type must be one of {', '.join(map(repr, DEVICE_TYPES))} (or None for all), "
                         f"got {device_type!r}")
    folder = Path(results_dir) if results_dir is not None else default_results_dir()
    if not folder.is_dir():
        if results_dir is not None:  # asked for by name: a typo must not look like "no records yet"
            raise ValueError(f"results folder {folder} does not exist")
        return []
    records = [load_record(p) for p in sorted(folder.rglob("*.json"))]
    if experiment is not None:
        records = [r for r in records if r.experiment == experiment]
    if device_type is not None:
        records = [r for r in records if r.provenance.device_type == device_type]
    return sorted(records, key=lambda r: r.provenance.date, reverse=True)


# The full profile's course model before it was re-sized to train a wider model for fewer steps; records made
# before then do not store their ``course_model``.
EARLIER_FULL_MODEL = {"d_model": 384, "n_layers": 6, "n_heads": 6, "context": 256, "batch": 64}
EARLIER_FULL_UNTIL = "2026-11-25"
# Experiments that do not train the course model (they time products, copies or compiled layers, trace the small
# model, or train an MLP): their records name no course model.
NO_COURSE_MODEL = frozenset({"tf32_matmul_rounding", "matmul_throughput", "fp8_linear_speed", "fp8_compiled_speed",
                             "autocast_trace", "data_loading", "clipping_runs"})


def describe_records(records: Sequence[Record | RecordedResult], experiment: str | None = None) -> str:
    """Markdown: one line per record naming its hardware, versions, date and command; with no record,
    a short note (naming the command that records ``experiment`` on a GPU, when given)."""
    if not records:
        if experiment:
            return (f"*Not recorded on a GPU yet: `python -m course_lib.record {experiment} --out results/` "
                    "records it.*")
        return "*No recorded result for this experiment yet.*"
    lines = []
    for r in records:
        p = r.provenance
        cuda = f", CUDA {p.cuda_version}" if p.cuda_version else ""
        size = record_size_text(r.record if isinstance(r, RecordedResult) else r)
        lines.append(f"- **{r.label}**: torch {p.torch_version}{cuda}, {p.date}, commit "
                     f"`{p.git_commit[:12]}`, command `{p.command}`{size and '; ' + size}")
    return "\n".join(lines)


def record_size_text(record: Record) -> str:
    """The size a record ran at, for a reader comparing it with a live run: its profile and the course
    model's shape then (stored as ``course_model`` since the full profile's re-size; before it, the full
    profile's model was :data:`EARLIER_FULL_MODEL`); ``""`` when the record names no profile."""
    size = record.parameters.get("size", record.parameters.get("profile"))
    if size not in ("small", "full"):
        return ""
    model = record.course_model
    if model is None:
        return f"{size} profile"
    try:
        shape = (f"{model['d_model']} wide, {model['n_layers']} layers, {model['n_heads']} heads, context "
                 f"{model['context']}, batch {model['batch']}")
    except (KeyError, TypeError):
        raise RecordError(f"{record.path}: course_model must name d_model, n_layers, n_heads, context and "
                          f"batch, got {model!r}") from None
    if record.earlier_full_model:
        return (f"an earlier full profile, a narrower course model than today's ({shape}; "
                "see {doc}`the setup page </book/setup>`)")
    return f"{size} profile, course model {shape}"


