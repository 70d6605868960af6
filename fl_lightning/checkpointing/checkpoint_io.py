"""Writing and reading checkpoints safely.

* Writing is atomic (:func:`atomic_save`): a crash at any point leaves either the old file or the
  new one, never a truncated one, and a full disk is one :class:`CheckpointWriteError` naming the folder.
* Writing is incremental (:mod:`~fl_lightning.checkpointing.client_shards`): client-store entries go into shard
  files beside the checkpoint, each entry once per folder, before the checkpoint that references them.
* Reading checks the file whole first (every zip member's CRC-32, :mod:`~fl_lightning.checkpointing.integrity`);
  a file that is not, cannot be read, or holds no federated run fails with one clear line naming it instead
  of a silently corrupt tensor, a raw ``OSError``, ``KeyError`` or unpickling error.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from typing_extensions import override

from fl_lightning.checkpointing.frozen_base import base_path, frozen_digest, reference_of, split_frozen
from fl_lightning.checkpointing.client_shards import entry_nbytes, resolve_shards, shard_writer, split_shards, unreferenced_shards
from fl_lightning.checkpointing.integrity import CheckpointError, integrity_problem, one_line
from fl_lightning.server.spill_arena import release_mapped_pages

#: Entries of the federated loop state that every checkpoint has, and their types.
_REQUIRED: dict[str, type] = {
    "rounds_done": int,
    "algorithm": dict,
    "history": list,
    "total_upload_bytes": int,
    "total_download_bytes": int,
}


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota); the previous checkpoint is intact."""


#: The errors of a write that a full disk or quota causes.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def atomic_save(checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Saves ``checkpoint`` to ``path`` so that a crash leaves the old file or the new one, whole.

    The bytes stream to a temporary file in the same folder (a rename across file systems would be a
    copy), tensor by tensor, so that a save holds no serialised copy of the checkpoint in memory (client
    stores' spilled entries go from their memory-mapped files to the checkpoint); the file is flushed to
    disk (``fsync``) and renamed over ``path``, and the folder is then synced so that the rename itself
    survives a power loss.

    Raises:
        CheckpointWriteError: one line naming the folder when the disk or quota is full.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    written = 0
    try:
        with open(temp, "wb") as file:
            try:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            finally:
                written = file.tell()
        os.replace(temp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            raise CheckpointWriteError(
                f"Cannot write checkpoint {os.path.basename(path)}: no space left in {folder} "
                f"(it filled after {written} bytes); the checkpoints written before are intact."
            ) from err
        raise
    sync_folder(folder)


_TEMP = re.compile(r"\..+\.(\d+)\.tmp")


def sweep_orphan_temp_files(folder: str | os.PathLike[str]) -> list[str]:
    """Removes the ``.<name>.<pid>.tmp`` files of :func:`atomic_save` in ``folder`` whose writer ``pid`` is
    no longer alive (a SIGKILL or OOM kill mid-save); returns their paths. A live writer's file is kept."""
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(folder):
            match = _TEMP.fullmatch(name)
            if match and not _alive(int(match.group(1))):
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
                    removed.append(path)
    return removed


def sweep_unreferenced_shards(folder: str | os.PathLike[str]) -> list[str]:
    """Removes the client shards in ``folder`` that no checkpoint there references
    (:func:`~fl_lightning.checkpointing.client_shards.unreferenced_shards`; none when a checkpoint there cannot be
    read), except a live other process's, which may be about to commit the round that references it; returns their paths."""
    removed = []
    for path in unreferenced_shards(folder) or []:
        writer = shard_writer(path)
        if writer == os.getpid() or not _alive(writer):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's live process (or a pid no signal can name): not ours to judge
    return True


def sync_folder(folder: str) -> None:
    """Makes the renames and links in ``folder`` durable (``fsync`` of the folder; no-op where unsupported)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


class CheckedCheckpointIO(CheckpointIO):
    """Delegates to ``inner``, except that Lightning's own IO saves local files with
    :func:`atomic_save`; loading raises :class:`CheckpointError` naming the file when a local file is not
    whole (:func:`~fl_lightning.checkpointing.integrity.integrity_problem`, checked before it is unpickled),
    cannot be read or is not a Lightning checkpoint; ``before_restore`` then sees it before anything in it is
    restored. :class:`~fl_lightning.FederatedTrainer` installs it.

    Args:
        inner: the strategy's checkpoint IO (by default Lightning's ``TorchCheckpointIO``).
        before_restore: called with each checkpoint read and its path (a resume's checks that must come before
            Lightning loads its weights into the module).
    """

    def __init__(self, inner: CheckpointIO, before_restore: Callable[[dict[str, Any], Any], None] | None = None) -> None:
        self.inner = inner
        self.before_restore = before_restore
        #: Per folder: revision -> the shard there that holds that client-store entry, and the entry's bytes.
        self._written: dict[str, dict[str, tuple[str, int]]] = {}

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        reference = reference_of(checkpoint)
        if reference is not None and _is_local_file_protocol(path):
            checkpoint, frozen = split_frozen(checkpoint, reference)
            base = base_path(path, reference["digest"])
            if not os.path.exists(base):
                atomic_save(frozen, base)
        # Another IO (a cloud store, a user's own) keeps its own guarantees, and its checkpoints keep their entries inline.
        if type(self.inner) is TorchCheckpointIO and storage_options is None and _is_local_file_protocol(path):
            folder = os.path.dirname(os.path.abspath(path))
            written = self._written.setdefault(folder, {})
            checkpoint, shards = split_shards(checkpoint, folder, written)
            for shard, entries in shards.items():  # before the round file, whose rename alone commits the round
                atomic_save(entries, os.path.join(folder, shard))
                written.update({rev: (shard, entry_nbytes(entry)) for rev, entry in entries.items()})
                release_mapped_pages()  # the spilled entries just written leave this process's resident memory
            atomic_save(checkpoint, path)
        else:
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    @override
    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"weights_only": weights_only}
        if map_location is not None:
            kwargs["map_location"] = map_location
        problem = integrity_problem(path) if _is_local_file_protocol(path) and os.path.exists(path) else None
        if problem is not None:
            raise CheckpointError(f"Cannot read checkpoint {path}: the file is truncated, corrupt or not a checkpoint ({problem}).")
        try:
            checkpoint = self.inner.load_checkpoint(path, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as err:  # torch.load's errors differ by where the file is cut
            raise CheckpointError(
                f"Cannot read checkpoint {path}: the file is truncated, corrupt or not a checkpoint "
                f"({type(err).__name__}: {one_line(str(err))})."
            ) from err
        if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint or "pytorch-lightning_version" not in checkpoint:
            found = sorted(map(str, checkpoint))[:8] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
            raise CheckpointError(f"{path} is not a Lightning checkpoint (found {found}).")
        checkpoint = with_frozen_base(dict(checkpoint), path, map_location)
        if _is_local_file_protocol(path):
            checkpoint = resolve_shards(checkpoint, path, map_location)
        if self.before_restore is not None:
            self.before_restore(checkpoint, path)
        return checkpoint

    @override
    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)
        if _is_local_file_protocol(path):
            sweep_unreferenced_shards(os.path.dirname(os.path.abspath(path)))

    @override
    def teardown(self) -> None:
        self.inner.teardown()


def with_frozen_base(checkpoint: dict[str, Any], path: Any, map_location: Any | None = None) -> dict[str, Any]:
    """``checkpoint`` with the frozen tensors it leaves to its base file (:mod:`~fl_lightning.checkpointing.frozen_base`)
    put back in its ``state_dict``, after checking their digest; unchanged when it leaves none out."""
    reference = reference_of(checkpoint)
    if reference is None or set(reference["names"]) <= set(checkpoint["state_dict"]):
        return checkpoint
    base = base_path(path, reference["digest"])
    try:
        frozen = torch.load(base, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(
            f"Checkpoint {path} keeps its {len(reference['names'])} frozen tensors (e.g. {reference['names'][0]}) in "
            f"{base}, which is missing: copy that file beside the checkpoint."
        ) from None
    except Exception as err:
        raise CheckpointError(
            f"Cannot read the frozen tensors of checkpoint {path} from {base} ({type(err).__name__}: {one_line(str(err))})."
        ) from err
    if not isinstance(frozen, Mapping) or set(frozen) != set(reference["names"]) or frozen_digest(frozen) != reference["digest"]:
        raise CheckpointError(
            f"{base} does not hold the frozen tensors checkpoint {path} was written with (digest {reference['digest']}): "
            "it was altered or replaced."
        )
    return {**checkpoint, "state_dict": {**checkpoint["state_dict"], **frozen}}


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint at ``path`` (tensors on the CPU, no code run; client entries read from their shards), checked as :class:`CheckedCheckpointIO`
    checks what a resume reads: for the CLI, which reads a checkpoint before the trainer exists."""
    return CheckedCheckpointIO(TorchCheckpointIO()).load_checkpoint(path, map_location="cpu", weights_only=True)


def model_settings_replaced(saved: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """One ``"name: given → saved"`` line per model setting whose checkpoint value ``saved`` replaces
    the configuration's ``given`` one (names starting with ``_`` are LightningCLI's bookkeeping)."""
    return [
        f"{name}: {given.get(name)!r} → {value!r}"
        for name, value in saved.items()
        if not str(name).startswith("_") and name in given and _listed(given[name]) != _listed(value)
    ]


def _listed(value: Any) -> Any:
    """A tuple as the list a checkpoint's YAML-like hyper-parameters hold."""
    return list(value) if isinstance(value, tuple) else value


def validate_federated_state(federated: Any, *, path: Any, max_rounds: int | None) -> None:
    """Checks the federated loop state read from checkpoint ``path`` before anything is restored.

    Raises:
        CheckpointError: naming the file and the bad entry, when the state is missing, an entry is
            absent or of the wrong type, ``rounds_done`` is outside ``0..max_rounds``, a byte count is negative, or
            ``history_start`` (the round of the first kept history entry) is outside ``0..rounds_done``.
    """
    name = f"Checkpoint {path}"
    if not isinstance(federated, Mapping):
        raise CheckpointError(f"{name} was not written by FederatedTrainer: it has no federated loop state.")
    for key, kind in _REQUIRED.items():
        value = federated.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, kind):
            raise CheckpointError(f"{name}: federated state `{key}` must be of type {kind.__name__}, got {value!r:.80}.")
    rounds = federated["rounds_done"]
    if rounds < 0 or (max_rounds is not None and max_rounds >= 0 and rounds > max_rounds):
        allowed = f"0..{max_rounds} (max_epochs)" if max_rounds is not None and max_rounds >= 0 else ">= 0"
        raise CheckpointError(f"{name}: `rounds_done={rounds}` is outside {allowed}.")
    for key in ("total_upload_bytes", "total_download_bytes"):
        if federated[key] < 0:
            raise CheckpointError(f"{name}: `{key}={federated[key]}` is negative.")
    start = federated.get("round_start_steps", [0, 0])
    if not (isinstance(start, list) and len(start) == 2 and all(type(s) is int and s >= 0 for s in start)):
        raise CheckpointError(f"{name}: `round_start_steps` must be two ints >= 0, got {start!r:.80}.")
    if not all(map(_is_id_list, federated["history"])):
        raise CheckpointError(f"{name}: federated state `history` must be a list of lists of client ids.")
    first = federated.get("history_start", 0)
    if type(first) is not int or not 0 <= first <= rounds:
        raise CheckpointError(f"{name}: `history_start` must be an int in 0..{rounds} (rounds_done), got {first!r:.80}.")


def _is_id_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def validate_restored_state(
    federated: Mapping[str, Any], global_state: Mapping[str, torch.Tensor], *, num_clients: int, path: Any
) -> None:
    """Checks, once the federation is known, what :func:`validate_federated_state` cannot: the global
    model is finite; every tensor of the algorithm's state (server optimizer moments and momentum,
    control variates, staleness and cluster state, ...) is finite and, when it is filed under a
    parameter's name, has that parameter's shape; no Python float in it is NaN (an ``inf`` can be a
    setting, such as DP-FedAvg's noise-free ``clip_norm``); every client id in ``history`` exists.
    One mechanism for every algorithm: their own ``load_state_dict`` checks their ranges.

    Raises:
        CheckpointError: naming the file and the first bad entry.
    """
    name = f"Checkpoint {path}"
    for key, tensor in global_state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{name}: the global model's `{key}` holds NaN or Inf.")
    for entry, value in _leaves(("algorithm",), federated["algorithm"]):
        where = ".".join(map(str, entry))
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise CheckpointError(f"{name}: algorithm state `{where}` holds NaN or Inf.")
            expected = global_state.get(entry[-1]) if isinstance(entry[-1], str) else None
            if expected is not None and value.shape != expected.shape:
                raise CheckpointError(
                    f"{name}: algorithm state `{where}` has shape {list(value.shape)}, but the model's "
                    f"`{entry[-1]}` has {list(expected.shape)}."
                )
        elif isinstance(value, float) and math.isnan(value):
            raise CheckpointError(f"{name}: algorithm state `{where}` is NaN.")
    for round_idx, clients in enumerate(federated["history"]):
        unknown = [c for c in clients if not 0 <= c < num_clients]
        if unknown:
            raise CheckpointError(
                f"{name}: `history[{round_idx}]` names client {unknown[0]}, but this federation has clients 0..{num_clients - 1}."
            )


def _leaves(entry: tuple[Any, ...], value: Any) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(path, value)`` of every value nested in mappings, lists and tuples."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves((*entry, key), item)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves((*entry, index), item)
    else:
        yield entry, value
