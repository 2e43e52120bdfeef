"""Nothing a confined command writes runs outside the sandbox later (issue 29, items 2-5): git's folder, .mcp.json,
.claude, the hooks folder git's config names and SOLO_HOME are read-only to everything confined, in the kernel (a
read-only bind mount in the zygote's mount namespace); where no namespace can be had, the guard puts them back at every
step and names a new gitlink; hooks run in the sandbox; the SessionEnd hooks run once the shells are gone and the
guarded files are back.

Each attack leaves a proof file behind only if something the user runs later (their own git, a hook) runs what the
model wrote; the user's git runs unconfined, as the user, during and after the session. The attacks run as root and,
when the tests run as root, as an ordinary user (nobody), with and without namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import PROGRAM
from tests.fake_openrouter import call, reply
from tests.test_confinement import as_nobody, readable_code
from tests.test_sandbox import confined, no_namespaces, private_tmp, real  # noqa: F401 (fixtures)

GIT_ENV = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@example.com", "GIT_COMMITTER_NAME": "u",
           "GIT_COMMITTER_EMAIL": "u@example.com", "GIT_CONFIG_NOSYSTEM": "1"}
END = ["end-config", "end-ls", "end-status"]  # what the user's SessionEnd hook writes, outside the sandbox
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def git(folder: Path, *args: str, user: list[str] = (), check: bool = True) -> subprocess.CompletedProcess:
    """The user's own git, unconfined (as `user` when given)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(folder.parent / "home"), **GIT_ENV}
    return subprocess.run([*user, "git", *args], cwd=folder, env=env, capture_output=True, text=True, check=check,
                          timeout=30)


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def attacks(proofs: Path) -> list[dict]:
    """The model's calls: each attack of the issue, then legitimate git commands."""
    payload = lambda name: f"touch {proofs}/{name}"
    return [
        call("Bash", {"command": "for i in $(seq 400); do git config core.fsmonitor '" + payload("fsmonitor") + "'; "
                      "printf '[core]\\n\\tfsmonitor = " + payload("fsmonitor") + "\\n' >> .git/config; "
                      "echo $i > poisoner; sleep 0.02; done 2>&1 | tail -1", "run_in_background": True}, id="bg"),
        call("Bash", {"command": "git init -q vendor/lib && git -C vendor/lib config core.fsmonitor '"
                      + payload("gitlink") + "' && git -C vendor/lib commit -q --allow-empty -m x && git update-index "
                      "--add --cacheinfo 160000,$(git -C vendor/lib rev-parse HEAD),vendor/lib"}, id="gitlink"),
        call("Bash", {"command": "mkdir -p .husky/_ && printf '#!/bin/sh\\n" + payload("husky") + "\\n' > "
                      ".husky/_/pre-commit && chmod +x .husky/_/pre-commit"}, id="husky"),
        call("Bash", {"command": "printf '#!/bin/sh\\n" + payload("lint") + "\\n' > lint.sh"}, id="lint"),
        call("Bash", {"command": "echo '{\"mcpServers\": {\"x\": {\"command\": \"touch\", \"args\": [\"" + str(proofs)
                      + "/mcp\"]}}}' > .mcp.json; mkdir -p .claude; echo '{}' > .claude/settings.json; ls -a"},
             id="mcp"),
        call("Bash", {"command": "echo more >> tracked.txt && git status --short && git diff --stat && "
                      "git log --oneline | wc -l"}, id="legit"),
    ]


def prepare(base: Path) -> tuple[Path, Path, Path]:
    """A repository whose git runs hooks from .husky/_ (missing, as before husky's first install) and whose user runs
    ./lint.sh after every command (the README's example hook) and `git status` when the session ends, outside the
    sandbox by their own choice; the folder proofs would land in, and the home."""
    ws, proofs, home = base / "ws", base / "proofs", base / "home"
    for folder in (ws, proofs, home / ".claude"):
        folder.mkdir(parents=True)
    os.chmod(proofs, 0o777)  # the sandbox, not file permissions, must keep proofs out
    git(ws, "init", "-q")
    git(ws, "config", "core.hooksPath", ".husky/_")
    (ws / "tracked.txt").write_text("one\n")
    (ws / "lint.sh").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(ws / "lint.sh", 0o755)
    git(ws, "add", "tracked.txt", "lint.sh")
    git(ws, "commit", "-qm", "first")
    outside = {"type": "command", "command": f"git status --short > {proofs}/end-status; ls -a > {proofs}/end-ls; "
               f"cat .git/config > {proofs}/end-config", "sandbox": False}
    (home / ".claude" / "settings.json").write_text(json.dumps({"hooks": {
        "PostToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./lint.sh"}]}],
        "SessionEnd": [{"hooks": [outside]}]}}))
    return ws, proofs, home


def results_of(body: dict) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}


def session(serve, base: Path, user: list[str], wrap: tuple[str, ...], during: bool) -> tuple[dict, str]:
    """Run the attacks in one session; while the model is asked last, the user runs `git status` (`during`: the
    kernel keeps .git read-only, so no moment is the attacker's). The results by call id, and stderr."""
    ws, proofs, home = prepare(base)
    if user:
        for path in [base, *base.rglob("*")]:
            os.chown(path, 65534, 65534, follow_symlinks=False)
    steps = attacks(proofs)

    def model(body: dict) -> dict:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done < len(steps):
            return reply(tool_calls=[steps[done]])
        wait_for(ws / "poisoner")
        if during:
            git(ws, "status", "--short", user=user)
        return reply("done")

    server = serve(model)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_", "GIT_"))}
    env.update(OPENROUTER_BASE_URL=server.url, OPENROUTER_API_KEY="sk-test-secret-123", HOME=str(home),
               TMPDIR=str(base / "tmp"), **GIT_ENV)
    (base / "tmp").mkdir()
    program = as_nobody(readable_code(base / "code")) if user else [str(PROGRAM)]
    proc = subprocess.run([*user, *wrap, *program, "-p", "go", "--sandbox", "workspace-write",
                           "--no-session-persistence"], cwd=ws, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return results_of(server.bodies[-1]), proc.stderr


def check_after(base: Path, user: list[str]) -> None:
    """After the session: the user's git status and commit run nothing the model wrote; nothing planted is left."""
    ws, proofs = base / "ws", base / "proofs"
    assert " M tracked.txt\n" in git(ws, "status", "--short", user=user).stdout
    git(ws, "commit", "-qam", "the user's own commit", user=user)
    assert git(ws, "log", "--oneline", user=user).stdout.count("\n") == 2
    assert sorted(p.name for p in proofs.iterdir()) == END  # no payload ran anywhere
    assert not any((ws / name).exists() for name in (".mcp.json", ".claude/settings.json", ".husky/_/pre-commit")), \
        sorted(p.name for p in ws.iterdir())
    assert "fsmonitor" not in (ws / ".git" / "config").read_text()
    assert git(ws, "ls-files", "-s", user=user).stdout.count("160000") == 0  # no gitlink


@pytest.fixture
def base(tmp_path):
    """A folder under /var/tmp (not a writable root of the tests' own runs), owned by nobody when root runs them."""
    folder = Path("/var/tmp") / f"solo-git-{os.getpid()}-{tmp_path.name}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def user_for(who: str) -> list[str]:
    """The command line prefix that runs as `who`; skip where root cannot become nobody."""
    if who == "nobody" and (os.geteuid() != 0 or not shutil.which("setpriv")):
        pytest.skip("needs root to become nobody")
    return NOBODY if who == "nobody" else []


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_nothing_the_model_writes_runs_outside_the_sandbox_later(serve, base, who):
    """Items 2-5 with mounts: every attack is refused by the kernel while the user's git runs during the session and
    after it; the user's SessionEnd hook (outside, by their choice) runs once the tree is clean; git status, git diff
    and git log work in the sandbox, and the user commits normally after it."""
    user = user_for(who)
    results, stderr = session(serve, base, user, (), during=True)
    assert "Read-only file system" in results["gitlink"], results["gitlink"]
    assert "Read-only file system" in results["husky"] and "[exit code 1]" in results["husky"], results["husky"]
    assert ".mcp.json: Is a directory" in results["mcp"], results["mcp"]  # an empty folder holds the name
    assert ".claude/settings.json: Read-only file system" in results["mcp"], results["mcp"]
    assert " M tracked.txt\n" in results["legit"] and " tracked.txt | 1 +" in results["legit"], results["legit"]
    assert results["legit"].endswith("\n1\n[exit code 0]"), results["legit"]  # git log read the one commit
    assert "PostToolUse hook ./lint.sh failed" in stderr  # the rewritten script ran confined: its touch was refused
    assert (base / "proofs" / "end-status").read_text() == " M lint.sh\n M tracked.txt\n?? poisoner\n?? vendor/\n"
    check_after(base, user)
    assert not (base / "ws" / ".claude").exists() and not (base / "ws" / ".husky").exists()  # the empty folders the
    # mounts held are gone


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_without_namespaces_the_guard_puts_everything_back_and_names_the_gitlink(serve, base, who, no_namespaces):
    """Items 2-3 where no mount namespace can be had: the guard puts back what the commands plant (the index too,
    when a gitlink appears in it) after every call and before every hook, and everything is back before SessionEnd."""
    user = user_for(who)
    results, stderr = session(serve, base, user, no_namespaces, during=False)
    assert "vendor/lib (a new gitlink in .git/index" in results["gitlink"] + results["husky"], results["gitlink"]
    assert ".husky/_/pre-commit (removed)" not in results["husky"]  # not guarded without mounts: the hooks folder
    assert "gives confined commands no namespaces" in stderr
    ended = (base / "proofs" / "end-ls").read_text().split()  # the background shell was ended, and what it and the
    assert ".mcp.json" not in ended and ".claude" in ended  # others planted put back, before SessionEnd (what
    assert not (base / "ws" / ".claude" / "settings.json").exists()  # was made in .claude removed, the folder kept)
    assert "fsmonitor" not in (base / "proofs" / "end-config").read_text()
    assert sorted(p.name for p in (base / "proofs").iterdir()) == END, \
        (base / "proofs" / "end-status").read_text()
    shutil.rmtree(base / "ws" / ".husky")  # a gitignored husky folder would not show: the hooks named by
    shutil.rmtree(base / "ws" / "vendor")  # core.hooksPath are kept read-only only by the mounts
    check_after(base, user)


# --- What is made read-only, in process ---------------------------------------------------------------


def test_what_is_made_read_only_and_the_empty_folders_that_hold_missing_names(tmp_path, private_tmp):
    """.git (a worktree's gitdir file, the folder it names and its commondir), .mcp.json, .claude, the hooks folder and
    the programs git's config names (existing ones), SOLO_HOME: each beneath a writable root; never a root itself."""
    main, ws, home = tmp_path / "main", tmp_path / "ws", tmp_path / "solo-home"
    git(tmp_path, "init", "-q", str(main))
    git(main, "commit", "-q", "--allow-empty", "-m", "x")
    git(main, "worktree", "add", "-q", str(ws))
    (ws / "tools").mkdir()
    (ws / "tools" / "conv.py").write_text("")
    git(ws, "config", "core.hooksPath", ".husky/_")
    git(ws, "config", "diff.pdf.textconv", "python3 tools/conv.py --flag")
    git(ws, "config", "core.pager", "less -R")
    gitdir = Path(real(main)) / ".git" / "worktrees" / "ws"
    protection = agent.protection((Path(real(ws)),), (Path(real(tmp_path)),), dict(os.environ), home)
    rw = Path(real(ws))
    assert set(protection.paths) == {rw / ".git", Path(real(main)) / ".git", rw / ".mcp.json", rw / ".claude",
                                     rw / ".husky" / "_", rw / "tools" / "conv.py", Path(real(home))}
    assert gitdir.is_relative_to(Path(real(main)) / ".git")  # within the common folder: one mount holds both
    assert {path for path, _ in protection.made} == {rw / ".mcp.json", rw / ".claude", rw / ".husky" / "_",
                                                     Path(real(home))}
    assert all(path.is_dir() for path, _ in protection.made)
    protection.remove()
    assert not any(os.path.lexists(p) for p in (ws / ".mcp.json", ws / ".claude", ws / ".husky", home))
    (tmp_path / "other").mkdir()
    assert agent.protection((rw,), (Path(real(tmp_path / "other")),), dict(os.environ), None).paths == ()
    protection = agent.protection((rw,), (rw,), dict(os.environ), rw)
    assert rw not in protection.paths and rw / ".mcp.json" in protection.paths  # a root is never made read-only
    protection.remove()
    assert not (ws / ".mcp.json").exists()


@pytest.fixture
def mounted(workspace, private_tmp, request):
    """A confined tool context whose sandbox keeps the workspace's git folder, .mcp.json and .claude read-only
    (`request.param`: --sandbox-git-write)."""
    git(workspace, "init", "-q")
    (workspace / "tracked.txt").write_text("one\n")
    git(workspace, "add", "tracked.txt")
    git(workspace, "commit", "-qm", "first")
    roots, folder = (Path(real(workspace)), Path(real(private_tmp))), Path(real(workspace))
    protection = agent.protection((folder,), roots, dict(os.environ), None, request.param)
    sandbox, _ = agent.make_sandbox("workspace-write", roots, False, read_only=protection.paths)
    assert sandbox.read_only == protection.paths
    env = {**agent.command_env(dict(os.environ)), "TMPDIR": str(private_tmp), **GIT_ENV}
    yield agent.ToolContext(cwd=workspace, env=env, sandbox=sandbox)
    sandbox.spawner.shutdown()
    protection.remove()


@pytest.mark.parametrize("mounted", [False], indirect=True)
def test_git_commands_that_write_fail_with_a_message_the_model_can_act_on(mounted, workspace):
    result = agent.tool_bash(mounted, "echo two >> tracked.txt && git commit -qam two")
    assert "index.lock': Read-only file system" in result and "[exit code 128]" in result, result
    assert "committing, checking out and changing git's config are for the user to do" in result
    assert agent.tool_bash(mounted, "git checkout -q -b other").count("Read-only file system") == 1
    assert agent.tool_bash(mounted, "git diff --stat && git log --oneline | wc -l").endswith(
        " 1 file changed, 1 insertion(+)\n1\n[exit code 0]")
    assert git(workspace, "log", "--oneline").stdout.count("\n") == 1


@pytest.mark.parametrize("mounted", [True], indirect=True)
def test_sandbox_git_write_lets_commands_commit_but_not_touch_config_or_hooks(mounted, workspace):
    result = agent.tool_bash(mounted, "echo two >> tracked.txt && git commit -qam two && git log --oneline | wc -l")
    assert result == "2\n[exit code 0]", result
    result = agent.tool_bash(mounted, "git config core.fsmonitor 'touch x'; echo evil > .git/hooks/pre-commit; "
                                      "echo '{}' > .mcp.json")
    assert "could not" in result.lower() or "busy" in result, result
    assert "pre-commit: Read-only file system" in result and ".mcp.json: Is a directory" in result, result
    assert "fsmonitor" not in (workspace / ".git" / "config").read_text()


def test_a_project_cannot_take_its_hooks_out_of_the_sandbox(tmp_path):
    """"sandbox": false is the user's to say: honoured in their settings and --settings, not in a project's files."""
    hook = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "true", "sandbox": False}]}]}}
    layers = [agent.Layer(scope, str(tmp_path / scope), hook, tmp_path) for scope in ("user", "flag", "project",
                                                                                      "local")]
    hooks, warnings = agent.load_hooks(layers)
    assert [h.outside for h in hooks] == [True, True, False, False]
    assert len(warnings) == 2 and all("honoured only in your own settings" in w for w in warnings)


def test_a_hook_runs_confined_with_its_input_and_output(confined, workspace, tmp_path):
    """Hooks start from the zygote (stdin, stdout and stderr as pipes), in the same sandbox as the commands."""
    (tmp_path / "outside").mkdir()
    code, out, err = agent.run_hook_command(f"cat; echo err >&2; touch {tmp_path}/outside/x", {"a": 1}, cwd=workspace,
                                            env=confined.env, timeout=20, start=confined.sandbox.zygote.popen)
    assert (code, out) == (1, '{"a": 1}') and err.startswith("err\n") and "Permission denied" in err, err
    assert not (tmp_path / "outside" / "x").exists()
    code, out, err = agent.run_hook_command("sleep 30", {}, cwd=workspace, env=confined.env, timeout=0.5,
                                            start=confined.sandbox.zygote.popen)
    assert code is None  # timed out, and killed


def test_verbose_says_which_protection_is_in_force(serve, run, workspace, private_tmp, no_namespaces):
    git(workspace, "init", "-q")
    server = serve(lambda body: reply("done"))
    result = run(["-p", "go", "--sandbox", "workspace-write", "--verbose", "--no-session-persistence"],
                 cwd=workspace, base_url=server.url, env={"TMPDIR": str(private_tmp)})
    assert "read-only to every confined process (kernel mounts): " + real(workspace) + "/.claude" in result.stderr
    result = run(["-p", "go", "--sandbox", "workspace-write", "--verbose", "--no-session-persistence"],
                 cwd=workspace, base_url=server.url, env={"TMPDIR": str(private_tmp)}, wrap=no_namespaces)
    assert "guarded files put back after every tool call, background shell event and before every hook" in \
        result.stderr
    assert sorted(p.name for p in workspace.iterdir()) == [".git", "app"]  # no empty folder left behind


def test_permissions_says_which_protection_is_in_force(serve, terminal, workspace):
    from tests.conftest import PROMPT
    term = terminal(serve(lambda body: reply("done")), "--sandbox", "workspace-write")
    term.send("/permissions\r")
    term.expect(r"sandbox workspace-write: git's folder, \.mcp\.json, \.claude: read-only to every confined process")
    term.expect(PROMPT)
    term.send("/exit\r")
    assert term.wait() == 0
    assert sorted(p.name for p in workspace.iterdir()) == ["app"]  # the empty folders made for the mounts are gone


def test_a_confined_session_end_hook_runs_after_the_commands_are_gone(serve, run, workspace, private_tmp, tmp_path):
    """The SessionEnd hook runs in the sandbox (its starter begun again once what commands left was ended): it writes
    in the project, not outside, and sees no background job still writing."""
    home = workspace.parent / "home"
    (home / ".claude").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    end = {"type": "command", "command": f"sleep 0.3; cat count > ended.txt; touch {tmp_path}/outside/x"}
    (home / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"SessionEnd": [{"hooks": [end]}]}}))
    steps = [call("Bash", {"command": "for i in $(seq 1000); do echo $i > count; sleep 0.01; done",
                           "run_in_background": True}, id="bg")]
    def model(body: dict) -> dict:
        if len(body["messages"]) < 3:
            return reply(tool_calls=steps)
        wait_for(workspace / "count")  # the background job is writing
        return reply("done")

    server = serve(model)
    result = run(["-p", "go", "--sandbox", "workspace-write", "--no-session-persistence"], cwd=workspace,
                 base_url=server.url, env={"TMPDIR": str(private_tmp)})
    assert result.code == 0, result.stderr
    wait_for(workspace / "ended.txt")
    assert (workspace / "ended.txt").read_text() == (workspace / "count").read_text()  # nothing wrote meanwhile
    assert not (tmp_path / "outside" / "x").exists() and "SessionEnd hook" in result.stderr


def test_write_refuses_the_hooks_folder_git_runs(workspace, private_tmp):
    """Item 4 for the file tools: husky's .husky/_ (gitignored, so no diff shows it) may not be written either."""
    from tests.test_sandbox import sandboxed, tool_call
    git(workspace, "init", "-q")
    git(workspace, "config", "core.hooksPath", ".husky/_")
    folder, roots = Path(real(workspace)), (Path(real(workspace)), Path(real(private_tmp)))
    protection = agent.protection((folder,), roots, dict(os.environ), None)
    assert protection.hooks == (folder / ".husky" / "_",)
    ctx = sandboxed(workspace, private_tmp, agent.Guard((folder,), False, False, protection.hooks))
    result = agent.run_tool_call(tool_call("Write", ".husky/_/pre-commit"), {t.name: t for t in agent.TOOLS}, ctx)
    assert result.startswith("Error: .husky/_/pre-commit may not be changed in this sandbox: git runs the hooks")
    agent.run_tool_call(tool_call("Write", ".husky/pre-commit"), {t.name: t for t in agent.TOOLS}, ctx)
    assert (workspace / ".husky" / "pre-commit").read_text() == "evil\n"  # husky's tracked sources stay the model's
    protection.remove()


def test_no_folder_on_the_way_can_be_renamed_to_make_a_guarded_path_anew(tmp_path):
    """A mount follows its folder when an ancestor is renamed: every folder between a writable root and a read-only
    path is bound too (writable, but a mount point cannot be renamed), the project's own folder in /tmp included."""
    ws = tmp_path / "ws"
    git(tmp_path, "init", "-q", str(ws))
    git(ws, "config", "core.hooksPath", ".husky/_")
    roots = (Path(real(ws)), Path(real(tmp_path)))
    protection = agent.protection((Path(real(ws)),), roots, dict(os.environ), None)
    sandbox, _ = agent.make_sandbox("workspace-write", roots, False, read_only=protection.paths,
                                    pinned=protection.pinned)
    ctx = agent.ToolContext(cwd=ws, env=agent.command_env(dict(os.environ)), sandbox=sandbox)
    try:
        for command in ("mv .husky .husky2 && mkdir -p .husky/_ && echo evil > .husky/_/pre-commit",
                        f"cd {tmp_path} && mv ws ws2 && mkdir -p ws/.git/hooks && echo evil > ws/.git/hooks/pre-commit",
                        "echo fine > .husky/notes && mv .husky/notes notes && cat notes"):
            agent.tool_bash(ctx, command)
    finally:
        sandbox.spawner.shutdown()
        protection.remove()
    assert sorted(p.name for p in ws.iterdir()) == [".git", "notes"] and (ws / "notes").read_text() == "fine\n"
    assert not (ws / ".git" / "hooks" / "pre-commit").exists() and not (tmp_path / "ws2").exists()


@pytest.mark.parametrize("mounted", [True], indirect=True)
def test_with_git_write_a_new_gitlink_is_named_and_the_index_put_back(mounted, workspace):
    """Item 3 where commands may write .git: a gitlink to a repository the command made (with a payload in its config)
    is named, and the index is put back, so the user's git status never enters it."""
    ctx = mounted._replace(guard=agent.Guard((Path(real(workspace)),), False, True))
    proof = workspace.parent / "gitlink-proof"
    result = agent.tool_bash(ctx, f"git init -q vendor/lib && git -C vendor/lib config core.fsmonitor 'touch {proof}' "
                                  "&& git -C vendor/lib commit -q --allow-empty -m x && git update-index --add "
                                  "--cacheinfo 160000,$(git -C vendor/lib rev-parse HEAD),vendor/lib && echo added")
    assert "added\n[exit code 0]\n[the sandbox undid changes" in result and \
        "vendor/lib (a new gitlink in .git/index, which git would enter and run what its config names: index put " \
        "back)" in result, result
    git(workspace, "status", "--short")
    assert not proof.exists() and "160000" not in git(workspace, "ls-files", "-s").stdout
