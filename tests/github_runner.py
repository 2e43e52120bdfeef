"""A runner emulation for the GitHub Action: a fake GitHub REST API on 127.0.0.1 that records every request,
a bare repository as the remote, and the composite action's steps run as the runner runs them (inputs and
expressions substituted, each `run:` written to a script under RUNNER_TEMP and run by bash -e)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
ACTION = ROOT / ".github" / "actions" / "solo"
REPO = "octo/widgets"
KEY = "sk-or-v1-0123456789abcdef0123456789abcdef"
TOKEN = "ghs_SecretTokenValue0123456789abcdefXYZ"


@dataclass
class Request:
    """One request the fake API got."""

    method: str
    path: str
    headers: dict
    body: Any


@dataclass
class FakeGitHub:
    """GitHub's REST API for one repository: permissions, issues, pull requests and comments."""

    permissions: dict = field(default_factory=dict)  # login -> admin/write/read...
    issues: dict = field(default_factory=dict)  # number -> issue object
    pulls: dict = field(default_factory=dict)  # number -> {"pr": object, "files": [...], "diff": str}
    comments: dict = field(default_factory=dict)  # number -> [comment objects]
    review_comments: dict = field(default_factory=dict)  # number -> [review comment objects]
    requests: list = field(default_factory=list)
    written: dict = field(default_factory=dict)  # comment id -> its bodies, first to last

    def __post_init__(self) -> None:
        self.lock, self.next_id = threading.Lock(), 9000
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def route(self, method: str, path: str, accept: str, body: Any) -> tuple[int, Any]:
        """The answer to one request."""
        path = path.split("?")[0]
        prefix = f"/repos/{REPO}"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}
        path = path[len(prefix):]
        if m := re.fullmatch(r"/collaborators/([^/]+)/permission", path):
            perm = self.permissions.get(m[1])
            return (200, {"permission": perm, "role_name": perm}) if perm else (404, {"message": "Not Found"})
        if m := re.fullmatch(r"/issues/(\d+)", path):
            return 200, self.issues[int(m[1])]
        if m := re.fullmatch(r"/issues/(\d+)/comments", path):
            return (200, self.comments.get(int(m[1]), [])) if method == "GET" else self.create(int(m[1]), body)
        if m := re.fullmatch(r"/pulls/(\d+)", path):
            pull = self.pulls[int(m[1])]
            return 200, pull["diff"] if "diff" in accept else pull["pr"]
        if m := re.fullmatch(r"/pulls/(\d+)/files", path):
            return 200, self.pulls[int(m[1])]["files"]
        if m := re.fullmatch(r"/pulls/(\d+)/comments", path):
            return 200, self.review_comments.get(int(m[1]), [])
        if m := re.fullmatch(r"/pulls/(\d+)/comments/(\d+)/replies", path):
            return self.create(int(m[1]), body)
        if (m := re.fullmatch(r"/(?:issues|pulls)/comments/(\d+)", path)) and method == "PATCH":
            self.written[int(m[1])].append(body["body"])
            return 200, {"id": int(m[1]), "body": body["body"]}
        return 404, {"message": "Not Found"}

    def create(self, number: int, body: dict) -> tuple[int, dict]:
        """A new comment by the action."""
        with self.lock:
            self.next_id += 1
            self.written[self.next_id] = [body["body"]]
            return 201, {"id": self.next_id, "body": body["body"]}

    def handler(self) -> type:
        """The request handler bound to this fake."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                fake.requests.append(Request(self.command, self.path, dict(self.headers), body))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    status, answer = 401, {"message": "Bad credentials"}
                else:
                    try:
                        status, answer = fake.route(self.command, self.path, self.headers.get("Accept", ""), body)
                    except KeyError:
                        status, answer = 404, {"message": "Not Found"}
                data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = answer

        return Handler


def git(*args: str, cwd: Path) -> str:
    """git in a test repository."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_remote(tmp: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """A bare remote whose main holds the files, and a workspace cloned from it as actions/checkout leaves one
    (the token in .git/config as an extra header)."""
    remote, seed, work = tmp / "remote.git", tmp / "seed", tmp / "workspace"
    git("init", "--quiet", "--bare", "--initial-branch=main", str(remote), cwd=tmp)
    git("init", "--quiet", "--initial-branch=main", str(seed), cwd=tmp)
    for name, text in files.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_text(text)
    git("add", "-A", cwd=seed)
    git("commit", "--quiet", "-m", "start", cwd=seed)
    git("push", "--quiet", str(remote), "main", cwd=seed)
    git("clone", "--quiet", str(remote), str(work), cwd=tmp)
    basic = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    git("config", "--local", "http.https://github.example/.extraheader", f"AUTHORIZATION: basic {basic}", cwd=work)
    return remote, work


def push_branch(tmp: Path, remote: Path, ref: str, files: dict[str, str]) -> None:
    """A commit on top of main with these files, pushed to the remote as `ref`."""
    scratch = tmp / f"scratch-{abs(hash(ref))}"
    git("clone", "--quiet", str(remote), str(scratch), cwd=tmp)
    for name, text in files.items():
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_text(text)
    git("add", "-A", cwd=scratch)
    git("commit", "--quiet", "-m", f"work on {ref}", cwd=scratch)
    git("push", "--quiet", "origin", f"HEAD:{ref}", cwd=scratch)


@dataclass
class StepRun:
    """What running the action left: its exit code, log, outputs and summary."""

    code: int
    log: str
    outputs: dict
    summary: str
    masks: list  # the values the step asked the runner to mask


def expression(text: str, inputs: dict, context: dict) -> str:
    """`${{ inputs.x }}`, `${{ github.x }}` and `${{ steps.x.outputs.y }}` substituted, as the runner does."""
    def value(match: re.Match) -> str:
        name = match[1].strip()
        if name.startswith("inputs."):
            return str(inputs.get(name[7:], ""))
        return str(context.get(name, ""))
    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def read_outputs(path: Path) -> dict:
    """The name<<DELIMITER blocks (and name=value lines) of a GITHUB_OUTPUT file."""
    outputs, lines = {}, path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        if "<<" in lines[i]:
            name, delimiter = lines[i].split("<<", 1)
            end = lines.index(delimiter, i + 1)
            outputs[name], i = "\n".join(lines[i + 1: end]), end + 1
        else:
            name, _, value = lines[i].partition("=")
            outputs[name], i = value, i + 1
    return outputs


def run_action(tmp: Path, workspace: Path, api: FakeGitHub, model_url: str, event: str, payload: dict,
               inputs: dict, actor: str = "alice", extra_env: dict | None = None, wrap: tuple = (),
               action: Path = ACTION) -> StepRun:
    """The composite action's steps, run as the runner runs them (under `wrap`: a runner without user namespaces;
    `action`: where the action lies, `uses: ./.github/actions/solo` puts it in the workspace)."""
    spec = yaml.safe_load((action / "action.yml").read_text())
    temp = tmp / "runner-temp"
    temp.mkdir(exist_ok=True)
    event_path, output, summary = temp / "event.json", temp / "output.txt", temp / "summary.md"
    event_path.write_text(json.dumps(payload))
    context = {"github.token": TOKEN, "github.action_path": str(action)}
    given = {name: expression(str(inputs.get(name, spec_input.get("default", ""))), {}, context)
             for name, spec_input in spec["inputs"].items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_", "GITHUB_"))}
    env.update({"GITHUB_EVENT_NAME": event, "GITHUB_EVENT_PATH": str(event_path), "GITHUB_REPOSITORY": REPO,
                "GITHUB_API_URL": api.url, "GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "4242",
                "GITHUB_ACTOR": actor, "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(temp),
                "GITHUB_ACTION_PATH": str(action), "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
                "OPENROUTER_BASE_URL": model_url, "ACTIONS_RUNTIME_TOKEN": "runtime-" + TOKEN[4:],
                "SOLO_ACTION_INTERVAL": "0", **(extra_env or {})})
    log, code, masks = "", 0, []
    for number, step in enumerate(spec["runs"]["steps"]):
        script = temp / f"step{number}.sh"
        script.write_text(expression(step["run"], given, context))
        step_env = {**env, **{k: expression(str(v), given, context) for k, v in (step.get("env") or {}).items()}}
        done = subprocess.run([*wrap, "bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=workspace,
                              env=step_env, capture_output=True, text=True, timeout=180)
        # the runner takes ::add-mask:: lines as commands, not log lines; the rest is kept unmasked, so that a
        # test sees whether a secret would have depended on the mask
        log += "".join(line for line in (done.stdout + done.stderr).splitlines(True)
                       if not line.startswith("::add-mask::"))
        masks += [line[12:].strip() for line in done.stdout.splitlines() if line.startswith("::add-mask::")]
        if done.returncode:
            code = done.returncode
            break
    outputs = read_outputs(output)
    declared = {name: expression(o["value"], {}, {f"steps.run.outputs.{k}": v for k, v in outputs.items()})
                for name, o in spec["outputs"].items()}
    return StepRun(code, log, declared, summary.read_text() if summary.exists() else "", masks)
