"""Reads what an offline W&B run recorded: its ``.wandb`` transaction log (wandb >= 0.31 writes
neither config.yaml nor wandb-summary.json offline)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

# LevelDB's log format: a 7-byte file header, then 32 KiB blocks of records, each with a 7-byte
# header (CRC-32 of type + data, length, type) and a chunk of a serialised `Record`.
_FILE_HEADER, _RECORD_HEADER, _BLOCK = struct.Struct("<4sHB"), struct.Struct("<IHB"), 32768
_FULL, _LAST = 1, 4


def _records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    assert _FILE_HEADER.unpack_from(data)[:2] == (b":W&B", 0xBEE1), f"{path} is not a W&B transaction log"
    pos, chunks = _FILE_HEADER.size, []
    while pos + _RECORD_HEADER.size <= len(data):
        if _BLOCK - pos % _BLOCK < _RECORD_HEADER.size:
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = _RECORD_HEADER.unpack_from(data, pos)
        if kind == 0:
            break
        chunk = data[pos + _RECORD_HEADER.size : pos + _RECORD_HEADER.size + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"corrupt record at byte {pos} of {path}"
        pos += _RECORD_HEADER.size + length
        chunks.append(chunk)
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


@dataclass
class OfflineRun:
    project: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: metric name -> step metric, from `define_metric`.
    step_metrics: dict[str, str] = field(default_factory=dict)

    def steps(self, key: str) -> list[int]:
        """The ``trainer/global_step`` (optimizer steps so far) of every history row that has ``key``."""
        return [row["trainer/global_step"] for row in self.history if key in row]

    def rounds(self, key: str) -> list[int]:
        """The ``round`` of every history row that has ``key``."""
        return [row["round"] for row in self.history if key in row]


def read_offline_run(path: Path) -> OfflineRun:
    """``path``: a ``run-*.wandb`` file."""
    run = OfflineRun()
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.project, run.group, run.job_type = record.run.project, record.run.run_group, record.run.job_type
            run.name = record.run.display_name
            run.tags = list(record.run.tags)
            run.config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run.config.update({_key(i): json.loads(i.value_json) for i in record.config.update})
            for item in record.config.remove:
                run.config.pop(_key(item), None)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run.summary.update({_key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "metric":
            run.step_metrics[record.metric.name or record.metric.glob_name] = record.metric.step_metric
    return run


def offline_runs(directory: Path) -> list[OfflineRun]:
    """Every offline run under ``directory``."""
    return [read_offline_run(path) for path in sorted(directory.rglob("offline-run-*/run-*.wandb"))]
