"""A local HTTP fake of the Hugging Face Hub, reached through HF_ENDPOINT: the repo endpoints
huggingface_hub and `datasets` call (whoami, create, info, tree, paths-info, resolve, preupload,
commit), the Jobs API's (run, list by label, inspect, cancel, logs, hardware) and the bucket a
local script of `run_uv_job` is shipped in. Routes, payloads and headers are huggingface_hub's
(the version tests/requirements.txt installs), read from its source.

A Job runs as a real process of the model script (`python SCRIPT ARGS`: the script run_uv_job
uploaded, or the one run_job's command fetches by URL for an image without uv; the env the Job
asks for, HF_ENDPOINT pointing back here, HOME an empty disk of its own); its stage follows the
process: SCHEDULING, RUNNING, then COMPLETED or ERROR. Faults a test sets on the server:

    server.throttle["list_jobs"] = 2     # the first 2 calls of that route answer 429
    server.job_faults[(1, 1)] = "fail"   # shard 1's first Job dies (CUDA out of memory)
    "stuck"                              # ... stays SCHEDULING, created 11 minutes ago
    "incomplete"                         # ... succeeds, and its last part is gone
    server.submit_faults = ["created-502"]  # the next submissions: the Job created, then 502;
    "created-drop"                       # ... created, then the connection closed, no answer;
    "502"                                # ... 502, and no Job created
    server.refuse = 402                  # the Jobs API refuses the account (402/403)
    server.refuse_whoami = 401           # the Hub refuses the token

    python tests/fake_hub_server.py --root /tmp/hub --port 8123   # by hand
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

USER = "user"
HARDWARE = [  # the shape of GET /api/jobs/hardware
    {"name": "cpu-basic", "prettyName": "CPU Basic", "cpu": "2 vCPU", "ram": "16 GB",
     "accelerator": None, "unitCostMicroUSD": 167, "unitCostUSD": 0.000167, "unitLabel": "minute"},
    {"name": "l4x1", "prettyName": "1x Nvidia L4", "cpu": "8 vCPU", "ram": "30 GB",
     "accelerator": {"type": "gpu", "model": "L4", "quantity": "1", "vram": "24 GB",
                     "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 13333, "unitCostUSD": 0.013333, "unitLabel": "minute"},
    {"name": "a10g-small", "prettyName": "1x Nvidia A10G", "cpu": "4 vCPU", "ram": "15 GB",
     "accelerator": {"type": "gpu", "model": "A10G", "quantity": "1", "vram": "24 GB",
                     "manufacturer": "Nvidia"},
     "unitCostMicroUSD": 16667, "unitCostUSD": 0.016667, "unitLabel": "minute"},
]
STUCK_AGE_S = 11 * 60  # a Job submitted 11 minutes ago, still waiting for a GPU
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def now_iso(seconds_ago: float = 0.0) -> str:
    when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds_ago)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """A repo's history: each commit a full snapshot (path -> bytes); the head is the last."""

    def __init__(self, kind: str, repo_id: str, private: bool):
        self.kind, self.id, self.private = kind, repo_id, private
        self.commits: list[tuple[str, dict[str, bytes]]] = []
        self.commit({".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"})

    @property
    def sha(self) -> str:
        return self.commits[-1][0]

    def commit(self, files: dict[str, bytes]) -> str:
        sha = hashlib.sha1(f"{self.id}:{len(self.commits)}:{uuid.uuid4()}".encode()).hexdigest()
        self.commits.append((sha, files))
        return sha

    def files(self, revision: str | None) -> dict[str, bytes] | None:
        revision = unquote(revision or "main")
        if revision in ("main", "HEAD", "refs/heads/main"):
            return self.commits[-1][1]
        for sha, files in self.commits:
            if sha == revision or len(revision) >= 7 and sha.startswith(revision):
                return files
        return None

    def sha_of(self, revision: str | None) -> str:
        revision = unquote(revision or "main")
        if revision in ("main", "HEAD", "refs/heads/main"):
            return self.sha
        return next(sha for sha, _ in self.commits if sha.startswith(revision))


class Job:
    def __init__(self, server: FakeHubServer, spec: dict, fault: str | None):
        self.server, self.spec, self.fault = server, spec, fault
        self.id = uuid.uuid4().hex[:24]
        self.labels = spec.get("labels") or {}
        self.created = time.time() - (STUCK_AGE_S if fault == "stuck" else 0)
        self.submitted = time.monotonic()
        self.started = self.finished = None
        self.process: subprocess.Popen | None = None
        self.cancelled, self.message = False, None
        self.home = server.root / "jobs" / self.id
        self.log = self.home / "log.txt"
        self.lock = threading.Lock()

    def stage(self) -> str:
        with self.lock:
            if self.cancelled:
                return "CANCELED"
            if self.process is None:
                hold = max(self.server.scheduling_s,
                           self.server.stuck_s if self.fault == "stuck" else 0)
                if time.monotonic() - self.submitted < hold:  # a test may hold every Job
                    return "SCHEDULING"
                self.start()
            code = self.process.poll()
            if code is None:
                return "RUNNING"
            if self.finished is None:
                self.finished = time.time()
                if code == 0 and self.fault == "incomplete":
                    self.server.lose_last_part(self)
                if code != 0:
                    self.message = f"exit code {code}"
            return "COMPLETED" if code == 0 else "ERROR"

    def start(self) -> None:
        self.started = time.time()
        self.home.mkdir(parents=True, exist_ok=True)
        command = self.server.container_command(self)
        if self.fault == "fail":  # the first attempt dies as a GPU out of memory does
            command = [sys.executable, "-c", f"import sys; print({OOM!r}, file=sys.stderr); "
                       "sys.exit(1)"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update({**(self.spec.get("environment") or {}), **(self.spec.get("secrets") or {}),
                    "HOME": str(self.home), "HF_HOME": str(self.home / "hf"),
                    "HF_DATASETS_CACHE": str(self.home / "datasets"),
                    "XDG_CACHE_HOME": str(self.home / "cache"),
                    "HF_ENDPOINT": self.server.url, "JOB_ID": self.id})
        self.process = subprocess.Popen(command, env=env, cwd=self.home,
                                        stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)

    def info(self) -> dict:
        stage = self.stage()
        return {
            "id": self.id, "createdAt": iso(self.created),
            "startedAt": iso(self.started) if self.started else None,
            "finishedAt": iso(self.finished) if self.finished else None,
            "dockerImage": self.spec.get("dockerImage"), "spaceId": self.spec.get("spaceId"),
            "owner": {"id": "0" * 24, "name": USER, "type": "user"},
            "command": self.spec.get("command"), "arguments": self.spec.get("arguments", []),
            "environment": self.spec.get("environment") or {},
            "secrets": sorted(self.spec.get("secrets") or {}),  # names only, as the Hub
            "flavor": self.spec.get("flavor"), "labels": self.labels,
            "volumes": self.spec.get("volumes"),
            "status": {"stage": stage, "message": self.message if stage == "ERROR" else None},
        }

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


class FakeHubServer:
    """The fake Hub: start() serves it on a free port of 127.0.0.1; `url` is its HF_ENDPOINT.
    `scripts` is the folder whose files a Job's `/data/NAME` (run_uv_job's upload) stands
    for: the upload's xet hash must be that file's."""

    def __init__(self, root: Path, scripts: Path | None = None, token: str | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.scripts, self.token = scripts, token
        self.repos: dict[tuple[str, str], Repo] = {}
        self.buckets: dict[str, dict[str, str]] = {}  # bucket id -> path -> xet hash
        self.jobs: list[Job] = []
        self.requests: list[tuple[float, str, str, int]] = []  # (time, method, route, status)
        self.throttle: dict[str, int] = {}  # route name -> 429s still to answer
        self.job_faults: dict[tuple[int, int], str] = {}
        self.submit_faults: list[str] = []
        self.refuse: int | None = None
        self.refuse_whoami: int | None = None
        self.scheduling_s, self.stuck_s = 0.3, 3.0
        self.rows = 0  # the input's rows: the "incomplete" fault finds a shard's parts by them
        self.lock = threading.RLock()
        self.httpd: ThreadingHTTPServer | None = None
        self.url = ""

    # ------------------------------------------------------------------ life

    def start(self) -> FakeHubServer:
        handler = type("Handler", (Handler,), {"hub": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for job in self.jobs:
            job.stop()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    # ------------------------------------------------------------------ repos

    def repo(self, kind: str, repo_id: str) -> Repo | None:
        return self.repos.get((kind, repo_id))

    def create_repo(self, kind: str, repo_id: str, private: bool = False) -> Repo:
        with self.lock:
            if (kind, repo_id) not in self.repos:
                self.repos[(kind, repo_id)] = Repo(kind, repo_id, private)
            return self.repos[(kind, repo_id)]

    def push_files(self, kind: str, repo_id: str, files: dict[str, bytes]) -> str:
        """A commit made by hand (a test's input dataset)."""
        with self.lock:
            repo = self.create_repo(kind, repo_id)
            sha = repo.commit({**repo.files(None), **files})
            self.mirror(repo)
            return sha

    def mirror(self, repo: Repo) -> None:
        """The head, as files under root/<kind>s/<repo> (to look at; the server reads memory)."""
        import shutil

        folder = self.root / f"{repo.kind}s" / repo.id
        shutil.rmtree(folder, ignore_errors=True)
        for path, data in repo.files(None).items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_bytes(data)

    def lose_last_part(self, job: Job) -> None:
        """A Job that says it succeeded, and the last part of its rows never reached the Hub."""
        args = job.spec["command"]
        n, i = (int(args[args.index(flag) + 1]) for flag in ("--num-shards", "--shard-index"))
        repo = next(r for (k, rid), r in self.repos.items() if k == "dataset" and
                    rid in args and any(p.startswith("data/part-") for p in r.files(None)))
        lo, hi = self.rows * i // n, self.rows * (i + 1) // n
        with self.lock:
            files = dict(repo.files(None))
            mine = sorted(p for p in files if p.startswith("data/part-")
                          and lo <= int(p.split("-")[1]) < hi)
            del files[mine[-1]]
            repo.commit(files)
            self.mirror(repo)

    # ------------------------------------------------------------------ jobs

    def container_command(self, job: Job) -> list[str]:
        """What the Job's image would run, here: `uv run /data/SCRIPT ARGS` (run_uv_job, the
        script uploaded to the bucket mounted at /data) as `python SCRIPT ARGS`."""
        command = list(job.spec["command"])
        if command[:2] == ["bash", "-lc"]:
            return self.install_command(job, command[2])
        if command[:2] != ["uv", "run"]:
            return ["sh", "-c", f"echo 'this fake runs uv run Jobs only: {shlex.join(command)}'"
                                f" >&2; exit 127"]
        words = command[2:]
        script = next(w for w in words if w.startswith("/data/") or w.endswith(".py"))
        args = words[words.index(script) + 1:]
        if script.startswith("/data/"):
            volume = next(v for v in job.spec.get("volumes") or [] if v["mountPath"] == "/data")
            files = self.buckets.get(volume["source"], {})
            name = script[len("/data/"):]
            uploaded = files.get(f"{volume.get('path')}/{name}")
            local = self.scripts / name
            if uploaded is None or uploaded != xet_hash(local):
                return ["sh", "-c", f"echo '{script}: not the uploaded {name}' >&2; exit 2"]
            script = str(local)
        return [sys.executable, script, *args]

    def install_command(self, job: Job, line: str) -> list[str]:
        """An image without uv (run_job): `pip install -q uv && python3 -c FETCH && uv run
        /tmp/SCRIPT ARGS`, here the fetch as written (the script by its URL, with the token),
        into the Job's own disk, then `python SCRIPT ARGS`; no pip, no uv."""
        words = shlex.split(line)
        fetch = words[words.index("-c") + 1]
        run = next(i for i in range(len(words) - 1) if words[i:i + 2] == ["uv", "run"])
        script, args = words[run + 2], words[run + 3:]
        local = str(job.home / Path(script).name)
        python = shlex.quote(sys.executable)
        return ["sh", "-c", f"{python} -c {shlex.quote(fetch.replace(script, local))} && "
                            f"exec {python} {shlex.quote(local)} {shlex.join(args)}"]

    def submit_job(self, spec: dict) -> Job:
        with self.lock:
            shard = (spec.get("labels") or {}).get("ocr-shard")
            fault = None
            if shard is not None:
                attempt = 1 + sum(j.labels.get("ocr-shard") == shard and
                                  j.labels.get("ocr-jobs") == spec["labels"].get("ocr-jobs")
                                  for j in self.jobs)
                fault = self.job_faults.get((int(shard), attempt))
            job = Job(self, spec, fault)
            self.jobs.append(job)
            return job

    def job(self, job_id: str) -> Job | None:
        return next((j for j in self.jobs if j.id == job_id), None)

    def calls(self, route: str | None = None, since: float = 0.0) -> list[tuple]:
        return [r for r in self.requests if (route is None or r[2] == route) and r[0] >= since]


def xet_hash(path: Path) -> str | None:
    from hf_xet import hash_files

    try:
        return hash_files([str(path)])[0].hash
    except Exception:
        return None


# ---------------------------------------------------------------------------- HTTP

REPO = r"(?P<kind>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)"
ROUTES = [  # (name, method, pattern): the name is what faults and counts refer to
    ("whoami", "GET", r"/api/whoami-v2"),
    ("agent_harnesses", "GET", r"/api/agent-harnesses"),  # huggingface_hub's, once a day
    ("create_repo", "POST", r"/api/repos/create"),
    ("validate_yaml", "POST", r"/api/validate-yaml"),  # a commit holding a README.md
    ("jobs_hardware", "GET", r"/api/jobs/hardware"),
    ("run_job", "POST", r"/api/jobs/(?P<ns>[^/]+)"),
    ("list_jobs", "GET", r"/api/jobs/(?P<ns>[^/]+)"),
    ("inspect_job", "GET", r"/api/jobs/(?P<ns>[^/]+)/(?P<job>[^/]+)"),
    ("cancel_job", "POST", r"/api/jobs/(?P<ns>[^/]+)/(?P<job>[^/]+)/cancel"),
    ("job_logs", "GET", r"/api/jobs/(?P<ns>[^/]+)/(?P<job>[^/]+)/logs"),
    ("create_bucket", "POST", r"/api/buckets/(?P<bucket>[^/]+/[^/]+)"),
    ("bucket_info", "GET", r"/api/buckets/(?P<bucket>[^/]+/[^/]+)"),
    ("xet_token", "GET", r"/api/(?P<kind>buckets|models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)"
                         r"/xet-(?P<mode>read|write)-token(?:/.*)?"),
    ("bucket_batch", "POST", r"/api/buckets/(?P<bucket>[^/]+/[^/]+)/batch"),
    ("repo_info", "GET", rf"/api/{REPO}(?:/revision/(?P<rev>[^/]+))?"),
    ("tree", "GET", rf"/api/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?"),
    ("paths_info", "POST", rf"/api/{REPO}/paths-info/(?P<rev>[^/]+)"),
    ("preupload", "POST", rf"/api/{REPO}/preupload/(?P<rev>[^/]+)"),
    ("commit", "POST", rf"/api/{REPO}/commit/(?P<rev>[^/]+)"),
    ("resolve", "GET", r"/(?:(?P<kind>datasets|spaces)/)?(?P<repo>[^/]+/[^/]+)/resolve/"
                       r"(?P<rev>[^/]+)/(?P<path>.+)"),
]
ROUTES = [(name, method, re.compile(pattern + "$")) for name, method, pattern in ROUTES]


class Handler(BaseHTTPRequestHandler):
    hub: FakeHubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self.dispatch("GET")

    def do_HEAD(self):
        self.dispatch("HEAD")

    def do_POST(self):
        self.dispatch("POST")

    def do_DELETE(self):
        self.dispatch("DELETE")

    # ------------------------------------------------------------------ plumbing

    def dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.status = 0
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        match_method = "GET" if method == "HEAD" else method
        for name, route_method, pattern in ROUTES:
            found = pattern.match(url.path)
            if found and route_method == match_method:
                self.route = name
                try:
                    if self.throttled(name):
                        return
                    getattr(self, "r_" + name)(**{k: unquote(v) if v else v
                                                 for k, v in found.groupdict().items()})
                except Exception as exc:  # a bug of the fake: said, not hung
                    import traceback

                    traceback.print_exc()
                    self.error(500, f"fake hub: {type(exc).__name__}: {exc}")
                finally:
                    self.hub.requests.append((time.monotonic(), method, name, self.status))
                return
        self.route = "unknown"
        self.hub.requests.append((time.monotonic(), method, f"unknown {url.path}", 404))
        print(f"fake hub: no route for {method} {self.path}", file=sys.stderr)
        self.error(404, f"no route {method} {url.path}")

    def throttled(self, name: str) -> bool:
        with self.hub.lock:
            left = self.hub.throttle.get(name, 0)
            if left > 0:
                self.hub.throttle[name] = left - 1
        if left > 0:
            self.error(429, "Too Many Requests (injected)", {"Retry-After": "1"})
        return left > 0

    def send(self, status: int, body: bytes = b"", headers: dict | None = None,
             content_type: str = "application/json") -> None:
        self.status = status
        self.send_response(status)
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)),
                   **(headers or {})}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def json(self, value, status: int = 200, headers: dict | None = None) -> None:
        self.send(status, json.dumps(value).encode(), headers)

    def error(self, status: int, message: str, headers: dict | None = None) -> None:
        self.json({"error": message}, status, headers)

    def repo_or_404(self, kind: str | None, repo_id: str) -> Repo | None:
        repo = self.hub.repo({"datasets": "dataset", "spaces": "space"}.get(kind, "model"),
                             repo_id)
        if repo is None:
            self.error(404, "Repository not found", {"X-Error-Code": "RepoNotFound"})
        return repo

    def form(self) -> dict:
        kind = self.headers.get("Content-Type", "")
        if "json" in kind:
            return json.loads(self.body or b"{}")
        return {k: v if len(v) > 1 or k == "paths" else v[0]
                for k, v in parse_qs(self.body.decode()).items()}

    # ------------------------------------------------------------------ account

    def r_whoami(self):
        if self.hub.refuse_whoami:
            return self.error(self.hub.refuse_whoami, "Invalid credentials in Authorization header")
        if self.hub.token and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            return self.error(401, "Invalid credentials in Authorization header")
        self.json({"type": "user", "id": "0" * 24, "name": USER, "fullname": "A User",
                   "orgs": [], "auth": {"type": "access_token",
                                        "accessToken": {"displayName": "t", "role": "write"}}})

    # ------------------------------------------------------------------ repos

    def r_agent_harnesses(self):
        self.error(404, "not served by this fake")

    def r_validate_yaml(self):
        self.json({"errors": [], "warnings": []})

    def r_create_repo(self):
        payload = json.loads(self.body or b"{}")
        kind = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or USER}/{payload['name']}"
        prefix = "" if kind == "model" else f"{kind}s/"
        url = f"{self.hub.url}/{prefix}{repo_id}"
        if self.hub.repo(kind, repo_id) is not None:  # the Hub's 409 names the repo too
            return self.json({"error": "You already created this repo", "url": url}, 409)
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        self.hub.create_repo(kind, repo_id, private)
        self.json({"url": url, "name": repo_id})

    def r_repo_info(self, kind, repo, rev=None):
        found = self.repo_or_404(kind, repo)
        if found is None:
            return
        files = found.files(rev)
        if files is None:
            return self.error(404, "Revision not found", {"X-Error-Code": "RevisionNotFound"})
        self.json({"id": repo, "author": repo.split("/")[0], "sha": found.sha_of(rev),
                   "private": found.private, "disabled": False, "gated": False,
                   "lastModified": now_iso(), "tags": [], "downloads": 0, "likes": 0,
                   "cardData": {}, "siblings": [{"rfilename": p} for p in sorted(files)]})

    def entries(self, files: dict[str, bytes], base: str, recursive: bool) -> list[dict]:
        base = base.strip("/")
        prefix = base + "/" if base else ""
        out, folders = [], set()
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):].split("/")
            if len(rest) > 1:
                for depth in range(1, len(rest) if recursive else 2):
                    folders.add(prefix + "/".join(rest[:depth]))
                if not recursive:
                    continue
            out.append(self.file_entry(path, files[path]))
        out += [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0,
                 "path": f} for f in sorted(folders)]
        return sorted(out, key=lambda e: e["path"])

    @staticmethod
    def file_entry(path: str, data: bytes) -> dict:
        return {"type": "file", "oid": git_blob_sha(data), "size": len(data), "path": path}

    def r_tree(self, kind, repo, rev, path=None):
        found = self.repo_or_404(kind, repo)
        if found is None:
            return
        files = found.files(rev)
        if files is None:
            return self.error(404, "Revision not found", {"X-Error-Code": "RevisionNotFound"})
        path = (path or "").strip("/")
        if path and path not in files and not any(p.startswith(path + "/") for p in files):
            return self.error(404, f"{path} not found", {"X-Error-Code": "EntryNotFound"})
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        self.json(self.entries(files, path, recursive))

    def r_paths_info(self, kind, repo, rev):
        found = self.repo_or_404(kind, repo)
        if found is None:
            return
        files = found.files(rev)
        if files is None:
            return self.error(404, "Revision not found", {"X-Error-Code": "RevisionNotFound"})
        paths = self.form().get("paths") or []
        paths = [paths] if isinstance(paths, str) else paths
        out = []
        for path in paths:
            path = path.strip("/")
            if path in files:
                out.append(self.file_entry(path, files[path]))
            elif any(p.startswith(path + "/") for p in files) or path == "":
                out.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(),
                            "size": 0, "path": path})
        self.json(out)

    def r_resolve(self, kind=None, repo=None, rev=None, path=None):
        found = self.repo_or_404(kind or "models", repo)
        if found is None:
            return
        files = found.files(rev)
        if files is None:
            return self.error(404, "Revision not found", {"X-Error-Code": "RevisionNotFound"})
        data = files.get(path)
        commit = found.sha_of(rev)
        if data is None:
            return self.error(404, "Entry not found", {"X-Error-Code": "EntryNotFound",
                                                       "X-Repo-Commit": commit})
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha(data)}"',
                   "Accept-Ranges": "bytes",
                   "Last-Modified": email.utils.formatdate(usegmt=True)}
        span = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if span:
            start = int(span.group(1))
            stop = min(int(span.group(2)) + 1 if span.group(2) else len(data), len(data))
            if start >= len(data) and len(data):
                return self.send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{max(stop - 1, start)}/{len(data)}"
            return self.send(206, data[start:stop], headers, "application/octet-stream")
        self.send(200, data, headers, "application/octet-stream")

    def r_preupload(self, kind, repo, rev):
        found = self.repo_or_404(kind, repo)
        if found is None:
            return
        files = found.files(rev) or {}
        payload = json.loads(self.body)
        self.json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                              "oid": git_blob_sha(files[f["path"]]) if f["path"] in files else None}
                             for f in payload["files"]]})

    def r_commit(self, kind, repo, rev):
        found = self.repo_or_404(kind, repo)
        if found is None:
            return
        lines = [json.loads(line) for line in self.body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        with self.hub.lock:
            parent = header.get("parentCommit")
            if parent is not None and parent != found.sha:
                return self.error(412, "A commit has happened since. Please refresh and try "
                                       "again.")
            files = dict(found.files(rev))
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    files[value["path"]] = base64.b64decode(value["content"])
                elif key == "deletedFile":
                    if value["path"] not in files:
                        return self.error(404, f"{value['path']} not found",
                                          {"X-Error-Code": "EntryNotFound"})
                    del files[value["path"]]
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    files = {p: d for p, d in files.items() if not p.startswith(prefix)}
                elif key == "lfsFile":
                    return self.error(400, "this fake answers preupload 'regular': no LFS")
            sha = found.commit(files)
            self.hub.mirror(found)
        prefix = "" if found.kind == "model" else f"{found.kind}s/"
        self.json({"success": True, "commitOid": sha, "pullRequestUrl": None,
                   "commitUrl": f"{self.hub.url}/{prefix}{repo}/commit/{sha}"})

    # ------------------------------------------------------------------ jobs

    def jobs_refused(self) -> bool:
        if self.hub.refuse:
            self.error(self.hub.refuse, "Payment required: add a payment method to run Jobs"
                       if self.hub.refuse == 402 else "You are not allowed to run Jobs")
            return True
        return False

    def r_jobs_hardware(self):
        self.json(HARDWARE)

    def r_run_job(self, ns):
        if self.jobs_refused():
            return
        spec = json.loads(self.body)
        with self.hub.lock:
            fault = self.hub.submit_faults.pop(0) if self.hub.submit_faults else None
        if fault == "502":
            return self.error(502, "Bad Gateway (injected)")
        job = self.hub.submit_job(spec)
        if fault == "created-502":
            return self.error(502, "Bad Gateway (injected, the Job created)")
        if fault == "created-drop":  # the connection closed before any answer
            self.status, self.close_connection = 0, True
            return
        self.json(job.info())

    def r_list_jobs(self, ns):
        if self.jobs_refused():
            return
        wanted = [tuple(label.split("=", 1)) for label in self.query.get("label", [])]
        stages = self.query.get("stage", [])
        out = []
        for job in list(self.hub.jobs):
            if all(job.labels.get(k) == v for k, v in wanted):
                info = job.info()
                if not stages or info["status"]["stage"] in stages:
                    out.append(info)
        self.json(out)

    def r_inspect_job(self, ns, job):
        found = self.hub.job(job)
        if found is None:
            return self.error(404, "Job not found")
        self.json(found.info())

    def r_cancel_job(self, ns, job):
        found = self.hub.job(job)
        if found is None:
            return self.error(404, "Job not found")
        with found.lock:
            found.cancelled = True
            found.finished = found.finished or time.time()
        found.stop()
        self.json({})

    def r_job_logs(self, ns, job):
        found = self.hub.job(job)
        if found is None:
            return self.error(404, "Job not found")
        lines = found.log.read_text(errors="replace").splitlines() if found.log.exists() else []
        tail = self.query.get("tail")
        if tail:
            lines = lines[-int(tail[0]):]
        stamp = now_iso(1.5)  # before the response's Date: a no-follow read keeps them all
        events = ["data: " + json.dumps({"data": "===== Job started =====", "timestamp": stamp})]
        events += ["data: " + json.dumps({"data": line, "timestamp": stamp}) for line in lines]
        self.send(200, ("\n\n".join(events) + "\n\n").encode(), {}, "text/event-stream")

    # ------------------------------------------------------------------ buckets (run_uv_job)

    def r_create_bucket(self, bucket):
        url = f"{self.hub.url}/buckets/{bucket}"
        if bucket in self.hub.buckets:  # the Hub's 409 names the bucket too
            return self.json({"error": "Bucket already exists", "url": url}, 409)
        self.hub.buckets[bucket] = {}
        self.json({"url": url, "id": bucket})

    def r_bucket_info(self, bucket):
        if bucket not in self.hub.buckets:
            return self.error(404, "Bucket not found", {"X-Error-Code": "RepoNotFound"})
        self.json({"id": bucket, "private": True})

    def r_xet_token(self, kind, repo, mode):
        cas = self.hub.root / "xet-cas"
        cas.mkdir(exist_ok=True)
        self.json({"casUrl": f"local://{cas}", "accessToken": "xet-" + uuid.uuid4().hex,
                   "exp": int(time.time()) + 3600})

    def r_bucket_batch(self, bucket):
        files = self.hub.buckets.setdefault(bucket, {})
        for line in self.body.splitlines():
            if line.strip():
                op = json.loads(line)
                if op["type"] == "addFile":
                    files[op["path"]] = op["xetHash"]
                elif op["type"] == "deleteFile":
                    files.pop(op["path"], None)
        self.json({"success": True, "failed": []})


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--scripts", type=Path, default=Path(__file__).resolve().parent.parent)
    ns = parser.parse_args()
    server = FakeHubServer(ns.root, ns.scripts).start()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
