"""The output store: OUTPUT's folder or Hub repo, its lock, claim, uploads, commits."""

import contextlib
import json
import math
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

from blocks.common.card import part_note
from blocks.common.errors import EXIT_NOT_WRITTEN, fail, log
from blocks.common.inputs import resolve_output, shown_path
from blocks.common.jobs_command import rerun_advice
from blocks.common.plan import Journal
from blocks.common.saving import PART_NAME, part_name, ranges_from_names
from blocks.common.secrets import redact_text

UPLOAD_ATTEMPTS, UPLOAD_BACKOFF_S, UPLOAD_MAX_WAIT_S = 5, 2.0, 600.0


def lock_holder(handle) -> str | None:
    """Lock an open file until this process dies, else who holds it (lockf: not inherited)."""
    import fcntl

    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):  # EAGAIN, EACCES: another process holds it
        handle.seek(0)
        return handle.read().strip() or "another process"
    except OSError as exc:  # ENOLCK, EOPNOTSUPP: some network and FUSE mounts
        log(f"warning: cannot lock {handle.name} ({exc.strerror or exc}): nothing stops a "
            f"second run writing to this OUTPUT")
    return None


def take_lock(path: Path, location: str, probe: bool = False):
    """The shard's lock, held until this process ends; `probe`: whether a run would get it."""
    if probe and not path.exists():
        return None
    handle = open(path, "a+")
    if holder := lock_holder(handle):
        fail(f"{holder} is writing this shard of {location}: wait for it to end, or write to "
             f"another OUTPUT")
    if probe:
        return handle.close()  # which lets the lock go
    handle.truncate(0)  # "a+" writes at the end, which is now the start
    print(f"pid {os.getpid()} on {os.uname().nodename}, since "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}", file=handle, flush=True)
    return handle


class OutputStore:
    """Parts under data/ of a folder (or staged for a Hub repo); the rest under .ocr/."""

    def __init__(self, target: str, args, hub_api=None):
        self.kind, self.target = resolve_output(target)
        self.api, self.column, self.read_only = None, args.output_column, args.check_only
        if self.kind == "local":
            self.root = Path(self.target)
            data = self.root / "data"  # what `datasets` reads (not hidden names)
            self.refuse_foreign([f for f in ("README.md", ".ocr/manifest.json")
                                 if (self.root / f).exists()] + [
                p.relative_to(self.root).as_posix() for p in sorted(data.rglob("*"))
                if p.is_file() and not any(n.startswith(".") for n in p.relative_to(data).parts)])
        else:
            from huggingface_hub import HfApi

            self.api = hub_api or HfApi(token=args.hf_token or None)
            base = Path(args.work_dir or "~/.cache/ocr-vllm-scripts/outputs").expanduser()
            if self.read_only:  # a folder that goes at exit
                self.scratch = tempfile.TemporaryDirectory(prefix="ocr-check-")
                base = Path(self.scratch.name)
            self.root = base / self.target.replace("/", "__")
        self.meta = self.root / ".ocr"
        self.made_root = self.kind == "local" and not self.root.exists()
        local_check = self.read_only and self.kind == "local"  # writes nothing to OUTPUT
        if not local_check:
            (self.root / "data").mkdir(parents=True, exist_ok=True)
            self.meta.mkdir(exist_ok=True)
        shard = f"shard-{args.shard_index}-of-{args.num_shards}"
        self.notes_name = f".ocr/notes/{shard}.json"
        self.notes: dict[str, dict] = {}  # part name -> part_note(), of the Hub's parts
        self.card_on_hub = self.created_manifest = False
        self.sent_parts = 0  # parts this run gave the Hub
        self.upload_failures: list[str] = []
        self.lock = take_lock(self.meta / f"lock-{shard}", self.location(), probe=local_check)
        self.journal = Journal(self.meta / "journal" / shard)
        self.remote_names: set[str] = set()  # data parts on the Hub
        self.keep_local: set[str] = set()  # staged parts with rows to redo
        self.shard_range, self.conflict = (0, 0), None
        self.queued: dict[str, Path] = {}  # path in repo -> local file, for the next commit
        self.commit_interval, self.sharded = 36.0 * max(1, args.num_shards), args.num_shards > 1
        self.last_commit, self.committing = -math.inf, None
        self.queue_lock = threading.Lock()
        if self.api is not None:
            if not self.read_only:
                self.api.create_repo(self.target, repo_type="dataset",
                                     private=args.private or None, exist_ok=True)
            self.sync_from_hub()

    def refuse_foreign(self, files) -> None:
        """Refused: an OUTPUT holding files besides ours: its card would go, or its rows mix."""
        ours = any(f == ".ocr/manifest.json" or f.startswith("data/part-") for f in files)
        if other := sorted(f for f in files if not (
                f == ".gitattributes" or f.startswith(".ocr/") or (f == "README.md" and ours)
                or (f.startswith("data/") and PART_NAME.match(f[len("data/"):])))):
            fail(f"OUTPUT {self.target} holds a dataset of its own ({', '.join(other[:3])}): "
                 f"this run would replace its card, or mix its rows. Write to a new "
                 f"{'folder' if self.api is None else 'repo'}, e.g. {shown_path(self.target)}-ocr")

    def download(self, name: str, local_dir: Path) -> Path:
        return Path(self.api.hf_hub_download(self.target, name, repo_type="dataset",
                                             local_dir=local_dir))

    def sync_from_hub(self) -> None:
        """The Hub is the truth, the staging folder a cache."""
        files = self.read_hub()
        self.refuse_foreign(files)
        if ".ocr/manifest.json" in files:
            hub = self.download(".ocr/manifest.json", self.meta / "hub")
            mine, theirs = self.manifest(), json.loads(hub.read_text())
            if mine and mine.get("run") != theirs.get("run"):
                log(f"{self.target} holds another run than {self.root}: clearing the latter")
                self.clear_local()
            (self.meta / "manifest.json").write_bytes(hub.read_bytes())
        elif (self.meta / "manifest.json").exists():  # its upload failed
            self.queued[".ocr/manifest.json"] = self.meta / "manifest.json"

    def read_hub(self, others_only: bool = False) -> set[str]:
        """The repo's files; its parts, card and notes (others_only: the other shards')."""
        try:
            files = set(self.api.list_repo_files(self.target, repo_type="dataset"))
        except Exception as exc:  # no repo yet: a run creates it, a check reads it as empty
            if not self.read_only or type(exc).__name__ != "RepositoryNotFoundError":
                raise
            files = set()
        self.remote_names |= {Path(f).name for f in files if f.startswith("data/") and not (
            others_only and self.in_shard(f))}  # one in this shard's rows: see commit
        self.card_on_hub = "README.md" in files
        for name in sorted(f for f in files if f.startswith(".ocr/notes/")):
            if not (others_only and name == self.notes_name):
                notes = json.loads(self.download(name, self.meta / "hub").read_text())
                self.notes.update({k: v for k, v in notes.items() if k in self.remote_names})
        return files

    def in_shard(self, name: str, whole: bool = False) -> bool:
        """Whether part `name` overlaps this shard's rows (whole: is within them)."""
        lo, hi = self.shard_range
        return any(lo <= a < b <= hi if whole else a < hi and lo < b
                   for a, b in ranges_from_names([name]))

    def fetch_part(self, name: str) -> Path:
        """A part only the Hub has, staged to redo its error rows here."""
        try:
            return self.download(f"data/{name}", self.root)
        except Exception as exc:
            fail(f"cannot download data/{name} from {self.target} ({type(exc).__name__}: "
                 f"{redact_text(str(exc))[:300]}). Nothing was sent; rerun the same command "
                 f"once the Hub answers.", EXIT_NOT_WRITTEN)

    def local_parts(self) -> list[Path]:
        return sorted((self.root / "data").glob("part-*.parquet"))

    def parts(self) -> list[tuple[tuple[int, int], Path | None]]:
        """((start, stop), local path or None) of every part."""
        local = {p.name: p for p in self.local_parts()}
        return [(r, local.get(part_name(*r))) for r in ranges_from_names(
            set(local) | self.remote_names)]

    def abandon(self) -> None:
        """A refused run removes the folder it made, if only its lock is in it."""
        if self.made_root and self.lock is not None and [
                p for p in self.root.rglob("*") if not p.is_dir()] == [Path(self.lock.name)]:
            shutil.rmtree(self.root, ignore_errors=True)

    def clear_local(self) -> None:
        """Journal first, manifest last: a kill half-way leaves no old rows to a new run."""
        shutil.rmtree(self.meta / "journal", ignore_errors=True)
        for path in self.local_parts() + [self.root / "README.md", self.meta / "manifest.json"]:
            path.unlink(missing_ok=True)

    def manifest(self) -> dict | None:
        path = self.meta / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else None

    def other_shards_rows(self) -> list[str]:
        """Parts outside this shard's rows, and other shards' journals with rows."""
        return [part_name(*r) for r, _ in self.parts() if not self.in_shard(part_name(*r), True)
                ] + [f".ocr/journal/{path.name}" for path in (self.meta / "journal").glob("*")
                     if path != self.journal.folder and any(path.glob("*.jsonl"))]

    def other_writers(self) -> list[str]:
        """The other shards a process writes right now (their locks held)."""
        running = []
        for path in sorted(self.meta.glob("lock-*")):
            if self.lock is None or path.name != Path(self.lock.name).name:
                with open(path, "a+") as other:
                    if holder := lock_holder(other):
                        running.append(f"{holder} writing {path.name[len('lock-'):]}")
        return running

    def restart(self, shard: str | None = None) -> None:
        """--restart: OUTPUT's rows, card and manifest go (only `shard`'s beside other shards)."""
        if self.read_only:
            return
        if shard is None and (running := self.other_writers()):
            fail(f"--restart removes every shard's rows, and {running[0]} of {self.location()}: "
                 f"stop it first")
        mine = {part_name(*r) for r, _ in self.parts()
                if shard is None or self.in_shard(part_name(*r), whole=True)}
        what = f"the {len(mine)} part(s) of {shard}" if shard else "the rows, card and manifest"
        log(f"--restart: removing {what} of {self.location()}")
        if self.api is not None:
            files = self.api.list_repo_files(self.target, repo_type="dataset")
            self.delete_on_hub([f for f in files if f == self.notes_name or Path(f).name in mine]
                               if shard else [f for f in files if f != ".gitattributes"],
                               f"Restart {shard or 'the OCR run'}")
            self.remote_names -= mine
        if not shard:
            self.clear_local()
        shutil.rmtree(self.journal.folder, ignore_errors=True)
        for name in mine:  # (the journal opens its file at its first row)
            (self.root / "data" / name).unlink(missing_ok=True)
            self.notes.pop(name, None)

    def delete_on_hub(self, files: list[str], message: str) -> None:
        from huggingface_hub import CommitOperationDelete

        if files:
            self.api.create_commit(self.target, repo_type="dataset", commit_message=message,
                                   operations=[CommitOperationDelete(f) for f in files])

    def write_manifest(self, manifest: dict, replace: bool = False) -> dict | None:
        """Record the run atomically; unless `replace`, only if OUTPUT has none, else return it."""
        if self.read_only:
            return None
        path = self.meta / "manifest.json"
        tmp = path.with_name(f".manifest.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(manifest, indent=1))
            os.replace(tmp, path) if replace else os.link(tmp, path)
        except FileExistsError:
            return json.loads(path.read_text())
        finally:
            tmp.unlink(missing_ok=True)
        self.created_manifest |= not replace
        if self.api is not None and not self.commit({".ocr/manifest.json": path}) \
                and self.conflict:
            fail(self.conflict)
        return None

    def forget_run(self) -> None:
        """A run that wrote nothing leaves no manifest (a degenerate stop, say)."""
        if self.created_manifest:
            (self.meta / "manifest.json").unlink(missing_ok=True)
            if self.api is not None:
                with self.queue_lock:
                    self.queued.pop(".ocr/manifest.json", None)
                with contextlib.suppress(Exception):  # left: a later run's --restart clears it
                    self.delete_on_hub([".ocr/manifest.json"], "Remove an empty run's manifest")

    def drop_stale_staged_parts(self) -> None:
        """The Hub's parts win over staged ones that overlap them, which are never resent."""
        for path in self.local_parts() if self.api is not None else []:
            (start, stop), = ranges_from_names([path.name])
            if self.in_shard(path.name) and any(
                    a < stop and start < b for a, b in ranges_from_names(self.remote_names)):
                path.unlink(missing_ok=True)

    def resend_local_parts(self) -> None:
        """Parts a killed or offline run of this shard left staged."""
        for path in self.local_parts():
            if self.in_shard(path.name) and path.name not in self.remote_names:
                self.publish(path)

    def publish(self, path: Path) -> None:
        """A part written (or rewritten) goes with the next commit."""
        if self.api is None:
            return
        with self.queue_lock:
            self.queued[f"data/{path.name}"] = path
            self.sent_parts += 1
        self.commit_if_due()

    def commit_if_due(self) -> None:
        with self.queue_lock:
            if not self.queued or self.committing and self.committing.is_alive() or \
                    time.monotonic() - self.last_commit < self.commit_interval:
                return
            files, self.queued = self.queued, {}
            self.last_commit = time.monotonic()
            self.committing = threading.Thread(target=self.commit, args=(files,), daemon=True)
            self.committing.start()

    def commit(self, files: dict) -> bool:
        """One commit of files and this shard's notes, retried; what fails is queued again."""
        from huggingface_hub import CommitOperationAdd

        parts = {Path(name).name: part_note(local, self.column)
                 for name, local in files.items() if name.startswith("data/")}
        notes = {k: v for k, v in {**self.notes, **parts}.items() if self.in_shard(k)}
        operations = [CommitOperationAdd(name, str(local)) for name, local in files.items()]
        if parts:  # a copy per commit: no note goes ahead of its part
            operations.append(CommitOperationAdd(self.notes_name, json.dumps(notes).encode()))
        for attempt in range(UPLOAD_ATTEMPTS):
            try:  # no lock reaches another container: a part in this shard's rows this run
                # neither found nor wrote stops it, and a commit after the check gets a 412
                head = self.api.repo_info(self.target, repo_type="dataset").sha
                if foreign := sorted(Path(f).name for f in self.api.list_repo_files(
                        self.target, repo_type="dataset", revision=head) if f.startswith("data/")
                        and Path(f).name not in self.remote_names and self.in_shard(f)):
                    lo, hi = self.shard_range
                    self.conflict = (f"another run is writing rows {lo}-{hi} of {self.target} at "
                                     f"the same time ({foreign[0]} appeared): stopping this one")
                    return False
                self.api.create_commit(self.target, operations=operations, repo_type="dataset",
                                       commit_message=f"Add {len(files)} file(s) (OCR)",
                                       parent_commit=head)
                break
            except Exception as exc:  # network, rate limit (429), a commit went first (412)
                after = str(getattr(getattr(exc, "response", None), "headers", {}).get(
                    "Retry-After"))
                wait = float(after) if after.isdigit() else \
                    UPLOAD_BACKOFF_S * 2 ** attempt * random.uniform(0.5, 1.0)
                last = attempt + 1 == UPLOAD_ATTEMPTS or wait > UPLOAD_MAX_WAIT_S
                log(f"commit of {len(files)} file(s) failed ({type(exc).__name__}: {exc}); "
                    + ("giving up on it for now" if last else f"retry in {wait:.0f} s"))
                if last:
                    with self.queue_lock:  # the final commit tries them again
                        self.queued = {**files, **self.queued}
                    return False
                time.sleep(wait)
        self.last_commit = time.monotonic()
        self.notes.update(notes)
        self.remote_names.update(parts)
        for name in parts.keys() - self.keep_local:  # on the Hub now
            (self.root / "data" / name).unlink(missing_ok=True)
        return True

    def finish(self, card) -> None:
        """The card (card(): its text), then (Hub) all queued files in one last commit."""
        if self.committing is not None:
            self.committing.join()
        card_failed = False
        if card is not None:
            try:
                (self.root / "README.md").write_text(card(), encoding="utf-8")
                self.queued["README.md"] = self.root / "README.md"
            except OSError as exc:  # the rows are written: a rerun writes it
                card_failed = self.api is not None  # exit 6: the card is not on the Hub
                log(f"error: cannot write the dataset card ({exc}); the rows written are kept. "
                    f"To write the card, {rerun_advice()}")
        files, self.queued = self.queued, {}
        if self.api is not None and files and not self.conflict and not self.commit(files):
            self.upload_failures = sorted(self.queued)
        # two shards ending at once: the card is remade till the last to finish counts them all
        for _ in range(3 if self.sharded and "README.md" in files and not (
                self.upload_failures or self.conflict) else 0):
            seen = set(self.remote_names)
            with contextlib.suppress(Exception):  # else it counts what this shard saw
                self.read_hub(others_only=True)
            if self.remote_names == seen:
                break
            (self.root / "README.md").write_text(card(), encoding="utf-8")
            if not self.commit({"README.md": self.root / "README.md"}):
                break
        if self.conflict:  # found during the run, or by this last commit
            log(f"error: {self.conflict}")
        elif self.upload_failures:
            log(f"{len(self.upload_failures)} file(s) did not reach the Hub; they are safe in "
                f"{self.root}. To upload them, {rerun_advice()}")
        self.upload_failures += ["README.md"] * card_failed

    def location(self) -> str:
        from huggingface_hub import constants  # HF_ENDPOINT's Hub

        return str(self.root) if self.kind == "local" else \
            f"{constants.ENDPOINT}/datasets/{self.target}"
