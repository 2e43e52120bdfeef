"""Settings files, permission rules and hooks (issue 22), in the shapes people write them: rules decided in
process against real paths, hooks run as real processes, the session question on a real terminal."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import PROMPT
from tests.fake_openrouter import call, last_result, reply, tool_then

KEY = "sk-test-secret-123"


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def rules_of(*texts_by_kind: tuple[str, list[str]], base: Path = Path("/proj")) -> dict:
    rules = {kind: [] for kind in agent.RULE_KINDS}
    for kind, texts in texts_by_kind:
        rules[kind] += [agent.parse_rule(t, "settings.json", base) for t in texts]
    return rules


# --- Rules: Claude Code's syntax and order ---------------------------------------------------------


BASH = [  # deny, ask, allow; command; what decides
    ([], [], ["Bash(git status:*)"], "git status", "allow"),
    ([], [], ["Bash(git status:*)"], "git status --short", "allow"),
    ([], [], ["Bash(git status:*)"], "git status && rm -rf x", ""),  # every part must be allowed
    ([], [], ["Bash(git status:*)"], "git status; rm -rf x", ""),
    ([], [], ["Bash(git status:*)"], "git status | sh", ""),
    ([], [], ["Bash(git status:*)"], "git status $(rm -rf x)", ""),
    ([], [], ["Bash(git status:*)"], "git status `rm -rf x`", ""),
    ([], [], ["Bash(git status:*)"], "git status\nrm -rf x", ""),
    ([], [], ["Bash(git status:*)"], "git status & rm -rf x", ""),
    ([], [], ["Bash(git status:*)", "Bash(rm:*)"], "git status && rm -rf x", "allow"),
    ([], [], ["Bash(git status:*)"], "git status 'a && b'", "allow"),  # quoted: one command
    ([], [], ["Bash(git status:*)"], "git status 2>&1", "allow"),  # a redirect, not a background &
    ([], [], ["Bash(npm run:*)"], "npm runx", ""),  # a word boundary
    ([], [], ["Bash(npm run test:*)"], "npm run test -- --watch", "allow"),
    ([], [], ["Bash(npm install)"], "npm install", "allow"),
    ([], [], ["Bash(npm install)"], "npm install evil", ""),
    ([], [], ["Bash(git * main)"], "git push origin main", "allow"),
    ([], [], ["Bash(git * main)"], "git push origin main2", ""),
    ([], [], ["Bash(ls *)"], "ls", "allow"),  # a lone trailing ' *' takes the bare command
    ([], [], ["Bash(ls *)"], "ls -la", "allow"),
    ([], [], ["Bash(ls *)"], "lsof", ""),
    ([], [], ["Bash"], "anything at all", "allow"),
    (["Bash(rm:*)"], [], ["Bash"], "rm -rf x", "deny"),  # deny first, whatever allows
    (["Bash(rm:*)"], [], ["Bash"], "echo hi && rm -rf x", "deny"),  # any part denied: the whole
    (["Bash(rm:*)"], [], ["Bash"], "echo $(rm -rf x)", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "echo `rm -rf x`", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "FOO=1 rm -rf x", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "/bin/rm -rf x", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "sudo rm -rf x", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "if true; then rm -rf x; fi", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "cat <(rm -rf x)", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "'rm' -rf x", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "/usr/bin/env rm -rf x", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "bash -c 'echo hi; rm -rf x'", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "eval \"rm -rf x\"", "deny"),
    (["Bash(rm:*)"], [], ["Bash"], "rmdir x", "allow"),
    (["Bash(rm:*)"], [], ["Bash"], "git status # don't\nrm -rf x #'", "deny"),  # a quote in a comment hides nothing
    ([], [], ["Bash(git status:*)"], "git status # don't\nrm -rf x #'", ""),
    (["Bash(rm:*)"], [], ["Bash"], "echo $'it\\'s'; rm -rf x", "deny"),  # \' does not end an ANSI-C string
    ([], ["Bash(git push:*)"], ["Bash(git:*)"], "git push origin main", "ask"),  # ask before allow
    ([], ["Bash(git push:*)"], ["Bash(git:*)"], "git add . && git push", "ask"),
    (["Bash(git push --force:*)"], ["Bash(git push:*)"], [], "git push --force", "deny"),  # deny before ask
]


@pytest.mark.parametrize("deny, ask, allow, command, expected", BASH, ids=[repr(c[3]) for c in BASH])
def test_bash_rules(deny, ask, allow, command, expected):
    rules = rules_of(("deny", deny), ("ask", ask), ("allow", allow))
    kind, _ = agent.decide(rules, "Bash", {"command": command}, Path("/proj"), Path("/home/u"))
    assert kind == expected


PATHS = [  # rule, tool, file_path, matches
    ("Read(//etc/passwd)", "Read", "/etc/passwd", True),  # //: absolute
    ("Read(//etc/passwd)", "Read", "/proj/etc/passwd", False),
    ("Read(~/.ssh/**)", "Read", "/home/u/.ssh/id_rsa", True),  # ~/: in the home
    ("Read(~/.ssh/**)", "Read", "/proj/.ssh/id_rsa", False),
    ("Read(/secrets/**)", "Read", "/proj/secrets/a/b.txt", True),  # /: the settings file's folder
    ("Read(/secrets/**)", "Read", "/proj/sub/secrets/b.txt", False),
    ("Read(./config/*.json)", "Read", "config/app.json", True),  # ./ and plain: the working directory
    ("Read(./config/*.json)", "Read", "config/deep/app.json", False),
    ("Read(.env)", "Read", "deep/down/.env", True),  # no slash: at any depth
    ("Read(*.env)", "Read", "a/prod.env", True),
    ("Read(docs/)", "Read", "docs/a/b.md", True),  # a folder: everything beneath it
    ("Read(./.env)", "Grep", ".env", True),  # Read rules govern Grep and Glob's path
    ("Edit(./src/**)", "Write", "src/new.py", True),  # Edit rules govern Write
    ("Edit(./src/**)", "Edit", "lib/x.py", False),
    ("Edit", "Write", "anything.txt", True),
    ("Read(./.env)", "Edit", ".env", False),
]


@pytest.mark.parametrize("text, tool, path, matches", PATHS, ids=[f"{p[0]} {p[1]} {p[2]}" for p in PATHS])
def test_path_rules_with_each_anchor(text, tool, path, matches):
    rules = rules_of(("deny", [text]))
    key = "path" if tool in ("Grep", "Glob") else "file_path"
    kind, rule = agent.decide(rules, tool, {key: path}, Path("/proj/work"), Path("/home/u"))
    assert (kind == "deny") == matches
    if tool != "Grep":  # the same rule allows where it would deny
        kind, _ = agent.decide(rules_of(("allow", [text])), tool, {key: path}, Path("/proj/work"), Path("/home/u"))
        assert (kind == "allow") == matches


def test_a_link_does_not_slip_past_a_deny_rule_nor_into_an_allow_rule(tmp_path):
    (tmp_path / ".env").write_text("SECRET=1\n")
    (tmp_path / "innocent").symlink_to(tmp_path / ".env")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "out").symlink_to("/etc/passwd")
    deny = rules_of(("deny", ["Read(./.env)"]))
    assert agent.decide(deny, "Read", {"file_path": "innocent"}, tmp_path, None)[0] == "deny"
    allow = rules_of(("allow", ["Edit(./src/**)"]))
    assert agent.decide(allow, "Edit", {"file_path": "src/out"}, tmp_path, None)[0] == ""


def test_a_hard_link_does_not_slip_past_a_deny_rule(tmp_path):
    """Issue 29: after `ln secret.txt hl.txt`, Read and Grep showed a file Read(./secret.txt) denies, and Write
    through a hard link rewrote a file Edit(./protected/**) denies: a rule covers every name of a file."""
    (tmp_path / "secret.txt").write_text("SECRET\n")
    os.link(tmp_path / "secret.txt", tmp_path / "hl.txt")
    (tmp_path / "protected" / "deep").mkdir(parents=True)
    (tmp_path / "protected" / "deep" / "keys.txt").write_text("keep\n")
    os.link(tmp_path / "protected" / "deep" / "keys.txt", tmp_path / "hl2.txt")
    (tmp_path / "plain.txt").write_text("plain\n")
    (tmp_path / "elsewhere").write_text("linked, but no rule names it\n")
    os.link(tmp_path / "elsewhere", tmp_path / "hl3.txt")
    rules = rules_of(("deny", ["Read(./secret.txt)", "Edit(./protected/**)"]), base=tmp_path)
    for tool, args in [("Read", {"file_path": "hl.txt"}), ("Grep", {"path": "hl.txt"}),
                       ("Write", {"file_path": "hl2.txt"}), ("Edit", {"file_path": str(tmp_path / "hl2.txt")})]:
        assert agent.decide(rules, tool, args, tmp_path, None)[0] == "deny", (tool, args)
    for tool, args in [("Read", {"file_path": "plain.txt"}), ("Read", {"file_path": "hl3.txt"}),
                       ("Read", {"file_path": "hl2.txt"}), ("Write", {"file_path": "hl.txt"}),
                       ("Grep", {"path": "."})]:
        assert agent.decide(rules, tool, args, tmp_path, None)[0] == "", (tool, args)
    anywhere = rules_of(("deny", ["Read(.env)"]), base=tmp_path)  # no folder in the pattern: looked for at any depth
    (tmp_path / "protected" / ".env").write_text("K=1\n")
    os.link(tmp_path / "protected" / ".env", tmp_path / "env-copy")
    assert agent.decide(anywhere, "Read", {"file_path": "env-copy"}, tmp_path, None)[0] == "deny"


def test_hard_links_in_a_tree_too_big_to_search_are_refused_not_guessed(tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "LINK_SCAN", 5)
    for n in range(10):
        (tmp_path / f"f{n}").write_text("x")
    (tmp_path / "a").write_text("linked\n")
    os.link(tmp_path / "a", tmp_path / "b")
    rules = rules_of(("deny", ["Read(*.secret)"]), base=tmp_path)
    assert agent.decide(rules, "Read", {"file_path": "b"}, tmp_path, None)[0] == "deny"
    assert agent.decide(rules, "Read", {"file_path": "f1"}, tmp_path, None)[0] == ""  # one link: nothing to search


def test_read_and_write_through_a_hard_link_are_refused_end_to_end(serve, run, workspace):
    (workspace / "secret.txt").write_text("TOP-SECRET\n")
    (workspace / "protected").mkdir()
    (workspace / "protected" / "config").write_text("original\n")
    calls = [call("Bash", {"command": "ln secret.txt hl.txt && ln protected/config hl2.txt"}, id="ln"),
             call("Read", {"file_path": "hl.txt"}, id="read"),
             call("Grep", {"pattern": "SECRET", "path": "hl.txt", "output_mode": "content"}, id="grep"),
             call("Write", {"file_path": "hl2.txt", "content": "rewritten\n"}, id="write")]
    server = serve(tool_then(calls, lambda body: "done"))
    result = run(["-p", "go", "--disallowed-tools", "Read(./secret.txt),Edit(./protected/**)"], cwd=workspace,
                 base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n"), result.stderr
    results = [m["content"] for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
    assert results[0].endswith("[exit code 0]") and (workspace / "hl.txt").exists()
    assert all("TOP-SECRET" not in r and "Read(./secret.txt)" in r for r in results[1:3]), results
    assert "Edit(./protected/**)" in results[3]
    assert (workspace / "protected" / "config").read_text() == "original\n"


@pytest.mark.parametrize("text, tool, matches", [
    ("mcp__github", "mcp__github__create_issue", True), ("mcp__github__*", "mcp__github__list", True),
    ("mcp__github__list", "mcp__github__list", True), ("mcp__github__list", "mcp__github__delete", False),
    ("mcp__git", "mcp__github__list", False), ("Skill(deploy)", "Skill", True),
])
def test_mcp_and_other_rules(text, tool, matches):
    kind, _ = agent.decide(rules_of(("deny", [text])), tool, {"name": "deploy"}, Path("/p"), None)
    assert (kind == "deny") == matches


def test_hostile_rules_and_commands_cost_little_and_deep_nesting_is_denied():
    rules = rules_of(("deny", ["Bash(" + "x*" * 30 + "y)"]))
    started = time.monotonic()
    assert agent.decide(rules, "Bash", {"command": "x " * 50_000}, Path("/p"), None)[0] == ""
    assert time.monotonic() - started < 0.5
    kind, rule = agent.decide(rules, "Bash", {"command": "$(" * 5000}, Path("/p"), None)
    assert kind == "deny" and "nested too deep" in rule.text


def test_malformed_rules_are_one_warning_each():
    layer = agent.Layer("project", "/p/.claude/settings.json", {"permissions": {"deny": [
        "Bash(", "Frobnicate(x)", "Bash()", "Bash(rm:*)", "WebFetch(domain:example.com)"]}}, Path("/p"))
    rules, warnings = agent.load_rules([layer])
    assert [r.text for r in rules["deny"]] == ["Bash(rm:*)", "WebFetch(domain:example.com)"]
    assert len(warnings) == 3 and all(w.startswith("/p/.claude/settings.json: ") for w in warnings)


@pytest.mark.parametrize("command, proposed", [
    ("git diff HEAD~1", ("Bash(git diff:*)",)), ("npm run test -- -x", ("Bash(npm run test:*)",)),
    ("ls -la", ("Bash(ls:*)",)), ("git status && make", ("Bash(git status:*)", "Bash(make:*)")),
    ("bash -c 'rm -rf /'", ("Bash(bash -c 'rm -rf /')",)), ("FOO=1 make", ("Bash(FOO=1 make)",)),
])
def test_always_proposes_the_commands_prefix_never_all_of_bash(command, proposed):
    assert agent.proposed_rules(rules_of(), "Bash", {"command": command}) == proposed
    assert agent.proposed_rules(rules_of(), "Write", {}) == ("Edit",)


@pytest.mark.parametrize("command, proposed", [
    ("for x in a b; do echo hi; done", ("Bash(echo:*)",)),
    ("for f in *.py; do wc -l x; grep y z; done | sort", ("Bash(wc:*)", "Bash(grep:*)", "Bash(sort:*)")),
    ("if test -f x; then cat x; else ls; fi", ("Bash(test:*)", "Bash(cat:*)", "Bash(ls:*)")),
    ("while true; do make; done", ("Bash(true:*)", "Bash(make:*)")),
    ("until ! make; do sleep 1; done", ("Bash(make:*)", "Bash(sleep:*)")),
    ("case $x in a) echo a;; *.txt) cat f;; esac", ("Bash(echo:*)", "Bash(cat:*)")),
    ("for x in $(ls); do true; done", ("Bash(true:*)", "Bash(ls:*)")),
])
def test_always_proposes_the_commands_a_loop_or_compound_runs_never_its_keywords(command, proposed):
    """Issue 33: `Bash(for:*)`, `Bash(do:*)`, `Bash(done)` were offered; and once the rules proposed are added, the
    same command runs without a question (its keywords need no rule)."""
    assert agent.proposed_rules(rules_of(), "Bash", {"command": command}) == proposed
    assert agent.decide(rules_of(("allow", list(proposed))), "Bash", {"command": command}, Path("/p"), None)[0] == \
        "allow"
    assert agent.decide(rules_of(("allow", list(proposed[:-1]))), "Bash", {"command": command}, Path("/p"),
                        None)[0] == ""
    assert agent.proposed_rules(rules_of(), "Bash", {"command": "for x in a b; do echo $x; done"}) == ("Bash(echo:*)",)


# --- Settings files -------------------------------------------------------------------------------


def test_files_in_precedence_order_lists_merge_scalars_take_the_highest_and_bad_keys_warn(tmp_path):
    home, project = tmp_path / "home", tmp_path / "repo"
    (project / ".git").mkdir(parents=True)
    write(home / ".claude" / "settings.json", {"model": "user/model", "permissions": {"deny": ["Bash(rm:*)"]},
                                               "cleanupPeriodDays": 7})
    write(project / ".claude" / "settings.json", {"model": "project/model", "permissions": {"deny": "Edit"},
                                                  "env": {"A": "1", "B": ["x"]}, "unknownKey": 1})
    write(project / ".claude" / "settings.local.json", "{not json")
    layers = agent.read_settings(agent.SETTING_SOURCES, home, project, '{"permissions": {"ask": ["Bash(git push:*)"]}}')
    assert [layer.scope for layer in layers] == ["user", "project", "local", "flag"]
    warnings = [w for layer in layers for w in layer.warnings]
    assert len(warnings) == 3, warnings
    assert any("settings.json: permissions.deny is not a list" in w for w in warnings)
    assert any("env.B is not a string" in w for w in warnings)
    assert any("settings.local.json is not valid JSON" in w for w in warnings)
    cfg = agent.Config(api_key="k", cwd=project, settings=layers)
    assert agent.apply_settings(cfg, trusted=True).model == "project/model"
    assert agent.apply_settings(cfg, trusted=False).model == "user/model"  # a project's model waits for trust
    assert agent.apply_settings(cfg, trusted=False).session_days == 7
    assert agent.apply_settings(cfg._replace(given=frozenset({"model"})), trusted=True).model == cfg.model
    rules, _ = agent.load_rules(agent.in_force(layers, trusted=False))
    assert [r.text for r in rules["deny"]] == ["Bash(rm:*)"] and [r.text for r in rules["ask"]] == ["Bash(git push:*)"]
    assert agent.settings_env(cfg, True) == {"A": "1"} and agent.settings_env(cfg, False) == {}
    only_user = agent.read_settings(("user",), home, project)
    assert [layer.scope for layer in only_user] == ["user"]
    with pytest.raises(agent.UsageError):
        agent.read_settings((), home, project, str(tmp_path / "missing.json"))


def test_no_settings_costs_a_few_stats(tmp_path):
    assert agent.read_settings(agent.SETTING_SOURCES, tmp_path / "home", tmp_path) == ()


# --- The agent: rules in -p and in a session ------------------------------------------------------


def scripted(*steps):
    """A model that makes these calls, one reply each, then answers with every result it got."""
    def model(body):
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done < len(steps):
            return reply(tool_calls=steps[done])
        return reply(" | ".join(m["content"] for m in body["messages"] if m["role"] == "tool"))
    return model


def make_agent(workspace: Path, *flags: str, ask=None, model=None, events=None, ask_trust=None) -> agent.Agent:
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    env = {"OPENROUTER_API_KEY": KEY, "HOME": str(home), "PATH": os.environ["PATH"],
           "SOLO_HOME": str(workspace.parent / "solo-home")}
    cfg = agent.build_config(agent.parse_args(["-p", "x", "--no-session-persistence", *flags]), env, workspace)
    events = [] if events is None else events
    made = agent.Agent(cfg, env, events.append, ask_user=ask, ask_trust=ask_trust)
    if model:
        made.model = made.compactor.model = Scripted(model)
    return made


class Scripted:
    """A scripted model where the agent expects its client."""

    def __init__(self, answer):
        self.answer = answer

    def __call__(self, body: dict) -> dict:
        return self.answer(body)

    def model_info(self, model: str) -> dict:
        return {}


def ask(made: agent.Agent, prompt: str = "go") -> agent.Outcome:
    return made.ask(agent.Conversation([{"role": "system", "content": "s"}]), prompt)


def test_a_project_deny_rule_holds_in_p_and_in_bypass_mode(workspace):
    write(workspace / ".claude" / "settings.json", {"permissions": {"deny": ["Edit", "Bash(rm:*)"]}})
    (workspace / "notes.txt").write_text("keep\n")
    events = []
    made = make_agent(workspace, "--yes", events=events, model=scripted(
        [call("Write", {"file_path": "notes.txt", "content": "gone"}, id="e")],  # Edit is not offered: Write is,
        # and Edit rules govern it
        [call("Bash", {"command": "touch made && rm notes.txt"}, id="b")]))
    outcome = ask(made)
    settings = workspace / ".claude" / "settings.json"
    assert outcome.answer == (f"Error: permission denied by Edit ({settings}) | "
                              f"Error: permission denied by Bash(rm:*) ({settings})")
    assert (workspace / "notes.txt").read_text() == "keep\n" and not (workspace / "made").exists()
    assert [e["denied"] for e in events if e["type"] == "tool_result"] == [True, True]


def test_an_ask_rule_with_p_is_a_denial_and_no_rule_runs_as_before(workspace):
    write(workspace.parent / "home" / ".claude" / "settings.json", {"permissions": {"ask": ["Bash(git push:*)"]}})
    made = make_agent(workspace, model=scripted([call("Bash", {"command": "git push origin main"}, id="a"),
                                                 call("Bash", {"command": "echo ran"}, id="b")]))
    first, second = ask(made).answer.split(" | ")
    assert first.startswith("Error: permission denied by Bash(git push:*) (") and "with -p nobody can answer" in first
    assert second == "ran\n[exit code 0]"


def test_untrusted_project_allow_rules_are_ignored_until_trusted(workspace):
    write(workspace / ".claude" / "settings.json", {"permissions": {"allow": ["Bash(touch:*)"]}})
    asked = []

    def asker(tool, args, proposals, call_id):
        asked.append(args["command"])
        return "y"

    events = []
    made = make_agent(workspace, ask=asker, events=events, model=scripted([call("Bash", {"command": "touch a"})]))
    ask(made)
    assert asked == ["touch a"]  # the project's allow rule did not skip the question
    notices = [e["text"] for e in events if e["type"] == "notice"]
    assert any("ignored what" in n and "start a session here and answer y" in n for n in notices), notices
    made = make_agent(workspace, ask=asker, ask_trust=lambda question: True,
                      model=scripted([call("Bash", {"command": "touch b"})]))
    ask(made)
    assert asked == ["touch a"] and (workspace / "b").exists()  # trusted now: no question
    made = make_agent(workspace, ask=asker, model=scripted([call("Bash", {"command": "touch c && rm b"})]))
    ask(made)
    assert asked == ["touch a", "touch c && rm b"]  # the trust is remembered; a compound command still asks


def test_always_adds_the_prefix_rule_for_the_session_only(workspace):
    answers = ["a"]
    asked = []

    def asker(tool, args, proposals, call_id):
        asked.append((args["command"], proposals))
        return answers.pop(0) if answers else "n"

    made = make_agent(workspace, ask=asker, model=scripted(
        [call("Bash", {"command": "git diff"}, id="1")], [call("Bash", {"command": "git diff --stat"}, id="2")],
        [call("Bash", {"command": "rm -rf x"}, id="3")]))
    outcome = ask(made)
    assert asked == [("git diff", ("Bash(git diff:*)",)), ("rm -rf x", ("Bash(rm:*)",))]
    assert outcome.answer.endswith("Error: permission denied: the user declined to let Bash run; ask them or try "
                                   "something else")


def test_a_question_names_the_call_it_is_about(workspace):
    """Each question carries its own call's id (the SDK's can_use_tool passes it on), not the last one started."""
    asked = []
    made = make_agent(workspace, ask=lambda tool, args, proposals, call_id: asked.append((args["command"], call_id))
                      or "y", model=scripted([call("Bash", {"command": "echo a"}, id="first"),
                                              call("Bash", {"command": "echo b"}, id="second")]))
    ask(made)
    assert asked == [("echo a", "first"), ("echo b", "second")]


# --- Hooks on real processes ----------------------------------------------------------------------


def hooked(workspace: Path, hooks: dict, *steps, flags=(), events=None, prompt="go"):
    """Run a prompt with these hooks in the user's settings (which need no trust); the outcome."""
    write(workspace.parent / "home" / ".claude" / "settings.json", {"hooks": hooks})
    made = make_agent(workspace, *flags, events=events, model=scripted(*steps))
    try:
        return ask(made, prompt)
    finally:
        made.close()


def pre(command: str, matcher: str = "Bash", timeout: float | None = None) -> dict:
    hook = {"type": "command", "command": command, **({"timeout": timeout} if timeout else {})}
    return {"PreToolUse": [{"matcher": matcher, "hooks": [hook]}]}


def test_a_pre_tool_use_hook_exiting_2_blocks_the_call_and_the_model_reads_why(workspace):
    outcome = hooked(workspace, pre("echo 'no touching' >&2; exit 2"), [call("Bash", {"command": "touch made"})])
    assert outcome.answer == "Error: blocked by a PreToolUse hook: no touching"
    assert not (workspace / "made").exists()


def test_a_hook_failing_with_exit_1_is_a_warning_and_the_call_runs_a_crashing_guard_fails_open(workspace):
    events = []
    outcome = hooked(workspace, pre("echo broken >&2; exit 1"), [call("Bash", {"command": "touch made"})],
                     events=events)
    assert outcome.answer == "(no output)\n[exit code 0]" and (workspace / "made").exists()
    assert any("PreToolUse hook" in e["text"] and "exit 1" in e["text"] and "broken" in e["text"]
               for e in events if e["type"] == "notice")


def test_a_hook_printing_json_nested_too_deeply_fails_open_with_a_warning(workspace):
    events = []
    deep = workspace.parent / "deep.json"
    deep.write_text('{"a":' * 10_000 + "1" + "}" * 10_000)
    outcome = hooked(workspace, pre(f"cat {deep}"), [call("Bash", {"command": "touch made"})], events=events)
    assert outcome.answer == "(no output)\n[exit code 0]" and (workspace / "made").exists()
    assert any("PreToolUse hook" in e["text"] and "not valid JSON" in e["text"]
               for e in events if e["type"] == "notice")


def test_a_hook_rewrites_the_input_and_its_allow_does_not_beat_a_deny_rule(workspace):
    rewrite = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                      "updatedInput": {"command": "echo rewritten"}}}
    outcome = hooked(workspace, pre(f"echo '{json.dumps(rewrite)}'"), [call("Bash", {"command": "echo original"})])
    assert outcome.answer == "rewritten\n[exit code 0]"
    write(workspace / ".claude" / "settings.json", {"permissions": {"deny": ["Bash(echo:*)"]}})
    outcome = hooked(workspace, pre(f"echo '{json.dumps(rewrite)}'"), [call("Bash", {"command": "echo original"})])
    assert outcome.answer.startswith("Error: permission denied by Bash(echo:*)")


def test_hooks_add_context_and_see_the_event_on_stdin_without_the_api_key(workspace):
    seen = workspace.parent / "seen"
    context = {"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "remember the tests"}}
    hooks = {"PostToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": f"cat > {seen}; env >> {seen}.env; echo '{json.dumps(context)}'"}]}],
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "echo 'today is Tuesday'"}]}]}
    events = []
    outcome = hooked(workspace, hooks, [call("Bash", {"command": "echo hi"}, id="c1")], events=events)
    assert outcome.answer == "hi\n[exit code 0]\n[Bash hook feedback: remember the tests]"
    data = json.loads(seen.read_text())
    assert data["hook_event_name"] == "PostToolUse" and data["tool_name"] == "Bash" and data["tool_use_id"] == "c1"
    assert data["tool_input"] == {"command": "echo hi"} and data["tool_response"] == "hi\n[exit code 0]"
    assert data["cwd"] == str(workspace) and data["permission_mode"] == "default" and "session_id" in data
    env = Path(f"{seen}.env").read_text()
    assert KEY not in env and "OPENROUTER_API_KEY" not in env and f"CLAUDE_PROJECT_DIR={workspace}\n" in env
    first_prompt = next(e for e in events if e["type"] == "request")["body"]["messages"][1]["content"]
    assert first_prompt == "go\n\n<hook-context>\ntoday is Tuesday\n</hook-context>"
    started = [e for e in events if e["type"] in ("hook_started", "hook_response")]
    assert [e["hook_event"] for e in started] == ["UserPromptSubmit"] * 2 + ["PostToolUse"] * 2


def test_a_stop_hook_keeps_the_model_going_once(workspace):
    script = write(workspace.parent / "stop.py", "import json, sys\n"
                   "if not json.load(sys.stdin)['stop_hook_active']:\n"
                   "    print('run the tests first', file=sys.stderr); sys.exit(2)\n")
    hooks = {"Stop": [{"hooks": [{"type": "command", "command": f"python3 {script}"}]}]}
    write(workspace.parent / "home" / ".claude" / "settings.json", {"hooks": hooks})
    made = make_agent(workspace, model=lambda body: reply(f"answer {len(body['messages'])}"))
    messages = agent.Conversation([{"role": "system", "content": "s"}])
    outcome = made.ask(messages, "go")
    assert outcome.answer == "answer 4"
    assert messages[3] == {"role": "user", "content": "[A Stop hook keeps you going: run the tests first]"}


def test_a_user_prompt_submit_hook_blocks_the_prompt(workspace):
    hooks = {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": "echo 'no secrets' >&2; exit 2"}]}]}
    sent = []
    with pytest.raises(agent.PromptBlocked, match="no secrets"):
        hooked(workspace, hooks, lambda body: sent.append(body))
    assert sent == []


def test_a_hook_that_hangs_is_killed_at_its_timeout_with_its_children(workspace):
    pidfile = workspace.parent / "pid"
    started = time.monotonic()
    outcome = hooked(workspace, pre(f"sleep 30 & echo $! > {pidfile}; wait", timeout=0.5),
                     [call("Bash", {"command": "echo ran"})])
    assert time.monotonic() - started < 5 and outcome.answer == "ran\n[exit code 0]"
    stat_file = Path(f"/proc/{int(pidfile.read_text())}/stat")
    assert not stat_file.exists() or stat_file.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # killed (a zombie
    # until whatever adopted it reaps it)


def test_a_hook_that_floods_is_cut_like_a_tool_result(workspace):
    events = []
    flood = "head -c 10000000 /dev/zero | tr '\\0' x >&2; exit 2"
    outcome = hooked(workspace, pre(flood), [call("Bash", {"command": "echo ran"})], events=events)
    assert outcome.answer.startswith("Error: blocked by a PreToolUse hook: xxx") and "bytes omitted" in outcome.answer
    assert len(outcome.answer) < agent.RESULT_LIMIT + 200


def test_a_missing_hook_command_warns_once_and_identical_hooks_run_once(workspace):
    count = workspace.parent / "count"
    events = []
    hooks = {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "no-such-hook-xyz"}]},
                            {"matcher": "*", "hooks": [{"type": "command", "command": f"echo x >> {count}"}]},
                            {"matcher": "Bash|Edit", "hooks": [{"type": "command", "command": f"echo x >> {count}"}]}]}
    hooked(workspace, hooks, [call("Bash", {"command": "true"})], [call("Bash", {"command": "true"})], events=events)
    warnings = [e["text"] for e in events if e["type"] == "notice" and "no-such-hook-xyz" in e["text"]]
    assert len(warnings) == 1 and "exit 127" in warnings[0]
    assert count.read_text() == "x\nx\n"  # one run per call


PRINT_ID = 'import json, sys; print(json.load(sys.stdin)["tool_use_id"])'


def test_hooks_hold_in_parallel_batches_and_in_forked_skills(workspace):
    log = workspace.parent / "log"
    (workspace / "a.txt").write_text("a\n")
    skill = workspace / ".claude" / "skills" / "sub"
    write(skill / "SKILL.md", "---\nname: sub\ndescription: d\ncontext: fork\n---\nread a.txt\n")
    hooks = {"PreToolUse": [{"matcher": "Read|Glob", "hooks": [
        {"type": "command", "command": f"python3 -c '{PRINT_ID}' >> {log}"}]}],
        "SubagentStop": [{"hooks": [{"type": "command", "command": f"echo subagent-stop >> {log}"}]}]}
    reads = [call("Read", {"file_path": "a.txt"}, id=f"r{i}") for i in range(3)]
    reads.append(call("Glob", {"pattern": "*"}, id="g"))
    hooked(workspace, hooks, reads)
    assert sorted(log.read_text().split()) == ["g", "r0", "r1", "r2"]
    log.unlink()
    hooked(workspace, hooks, [call("Read", {"file_path": "a.txt"}, id="in-fork")], prompt="/sub")
    assert log.read_text().split() == ["in-fork", "subagent-stop", "in-fork"]  # the fork's call, then the parent's


def test_untrusted_project_hooks_do_not_run_with_p_and_one_line_says_how(serve, run, workspace):
    marker = workspace.parent / "ran"
    write(workspace / ".claude" / "settings.json",
          {"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": f"touch {marker}"}]}]}})
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "go"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "ok\n") and not marker.exists()
    assert result.stderr.count("\n") == 1 and "start a session here and answer y" in result.stderr, result.stderr


def test_stream_json_and_verbose_show_each_hook(serve, run, workspace):
    write(workspace.parent / "home" / ".claude" / "settings.json", {"hooks": pre("true", "*")})
    server = serve(tool_then([call("Bash", {"command": "echo hi"})], lambda body: "done"))
    result = run(["-p", "go", "--output-format", "stream-json", "--verbose"], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    kinds = [(e["type"], e.get("subtype")) for e in lines]
    assert ("system", "hook_started") in kinds and ("system", "hook_response") in kinds
    response = next(e for e in lines if e.get("subtype") == "hook_response")
    assert response["hook_name"] == "PreToolUse:Bash" and response["exit_code"] == 0
    assert "hook PreToolUse:Bash (true) -> exit 0" in result.stderr and "settings: " in result.stderr


# --- The session question -------------------------------------------------------------------------


def test_the_session_question_shows_the_rule_and_s_saves_it(serve, terminal, workspace):
    (workspace / ".git" / "info").mkdir(parents=True)

    def model(body):
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if body["messages"][-1]["role"] == "user" or done < 2:
            return reply(tool_calls=[call("Bash", {"command": f"git diff --stat > out{done}"})])
        return reply("done: " + last_result(body))

    term = terminal(serve(model))
    term.send("go\r")
    shown = term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert "a: allow Bash(git diff:*) for this session; s: and save it in .claude/settings.local.json" in shown
    term.send("s\r")
    term.expect("done: ")
    term.expect(PROMPT)
    saved = workspace / ".claude" / "settings.local.json"
    assert json.loads(saved.read_text()) == {"permissions": {"allow": ["Bash(git diff:*)"]}}
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert ".claude/settings.local.json" in (workspace / ".git" / "info" / "exclude").read_text().splitlines()
    assert term.transcript.count("Allow Bash") == 1
    term.send("/permissions\r")
    term.expect(r"allow  Bash\(git diff:\*\)")
    term.expect(PROMPT)
    term.send("/exit\r")
    assert term.wait() == 0


def test_saving_a_rule_refuses_a_planted_link(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".claude").mkdir()
    target = write(tmp_path / "elsewhere.json", {})
    (tmp_path / ".claude" / "settings.local.json").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        agent.save_rules(tmp_path, ("Bash(ls:*)",))
    assert json.loads(target.read_text()) == {}


def test_session_start_pre_compact_and_session_end_hooks_see_their_fields(workspace):
    log = workspace.parent / "events.jsonl"
    command = {"type": "command", "command": f"cat >> {log}; echo >> {log}"}
    hooks = {event: [{"hooks": [command]}] for event in ("SessionStart", "PreCompact", "SessionEnd")}
    write(workspace.parent / "home" / ".claude" / "settings.json", {"hooks": hooks})
    made = make_agent(workspace, model=lambda body: reply("a summary"))
    messages = made.conversation()
    made.ask(messages, "go")
    assert made.compactor.compact(made.cfg, messages, 100, "manual", "the tests")
    made.close()
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["hook_event_name"], e.get("source") or e.get("trigger") or e.get("reason")) for e in seen] == [
        ("SessionStart", "startup"), ("PreCompact", "manual"), ("SessionStart", "compact"), ("SessionEnd", "other")]
    assert seen[1]["custom_instructions"] == "the tests"


def test_a_rule_saved_in_a_trusted_project_keeps_its_trust(workspace):
    (workspace / ".git").mkdir()
    write(workspace / ".claude" / "settings.json", {"permissions": {"allow": ["Bash(ls:*)"]}})
    made = make_agent(workspace, ask=lambda tool, args, proposals, call_id: "s", ask_trust=lambda question: True,
                      model=scripted([call("Bash", {"command": "echo one"})]))
    ask(made)
    assert json.loads((workspace / ".claude" / "settings.local.json").read_text())["permissions"]["allow"] == \
        ["Bash(echo:*)"]
    events = []
    made = make_agent(workspace, events=events, ask=lambda *a: pytest.fail("asked again"),
                      model=scripted([call("Bash", {"command": "echo two"})]))
    assert ask(made).answer == "two\n[exit code 0]"
    assert not [e for e in events if e["type"] == "notice"]  # still trusted: no line about ignored settings


@pytest.mark.parametrize("tracked", [False, True], ids=["untracked", "committed"])
def test_a_settings_local_json_approves_no_server_whatever_git_says(workspace, tracked):
    """Claude Code's MCP keys count only from the user's own settings and --settings: a file in the project folder
    is the repository's, tracked by git or not (issue 29: the .git/index check was defeated three ways)."""
    import subprocess
    write(workspace / ".mcp.json", {"mcpServers": {"x": {"command": "sh", "args": ["-c", "touch pwned"]}}})
    write(workspace / ".claude" / "settings.local.json", {"enableAllProjectMcpServers": True,
                                                          "enabledMcpjsonServers": ["x"]})
    if tracked:
        subprocess.run(["git", "init", "-q", str(workspace)], check=True)
        subprocess.run(["git", "-C", str(workspace), "add", ".claude/settings.local.json"], check=True)
    made = make_agent(workspace, "--strict-mcp-config")
    cfg = made.cfg
    made.close()
    assert agent.mcp_settings(cfg)[:2] == (False, set())
    assert not hasattr(agent, "committed")


def test_a_command_file_attaches_nothing_from_outside_the_working_directory(workspace):
    secret = workspace.parent / "home" / "id_rsa"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text("PRIVATE KEY\n")
    (workspace / "notes.md").write_text("inside\n")
    command = agent.Command("review", "", "", "", (), f"Review. @{secret} @notes.md")
    text = agent.render_command(command, "", workspace, lambda line: "")
    assert "PRIVATE KEY" not in text and "not attached: outside the working directory" in text
    assert '<file path="notes.md">\ninside' in text


def test_a_commands_bang_lines_pass_hooks_and_deny_rules_even_with_allowed_tools(workspace):
    write(workspace.parent / "home" / ".claude" / "settings.json",
          {"permissions": {"deny": ["Bash(rm:*)"]}, "hooks": pre("grep -q touch && exit 2; exit 0")})
    (workspace / "victim").write_text("keep\n")
    made = make_agent(workspace)
    try:
        assert agent.inline_output(made, "rm -rf victim").startswith("[rm -rf victim was not run: permission denied")
        assert "blocked by a PreToolUse hook" in agent.inline_output(made, "touch made")
        assert agent.inline_output(made, "echo fine") == "fine\n[exit code 0]"
    finally:
        made.close()
    assert (workspace / "victim").exists() and not (workspace / "made").exists()


def test_a_notification_hook_runs_when_the_prompt_waits(serve, terminal, workspace):
    """Claude Code's idle notification: a prompt left waiting past messageIdleNotifThresholdMs runs the hook."""
    write(Path(os.environ["HOME"]) / ".claude" / "settings.json", {"messageIdleNotifThresholdMs": 300, "hooks": {
        "Notification": [{"matcher": "", "hooks": [{"type": "command", "command": "cat > notified.json"}]}]}})
    term = terminal(serve(lambda body: reply("ok")))
    deadline = time.monotonic() + 15
    while not (workspace / "notified.json").exists() or not (workspace / "notified.json").read_text():
        assert time.monotonic() < deadline, "the Notification hook never ran"
        time.sleep(0.05)
    event = json.loads((workspace / "notified.json").read_text())
    assert event["hook_event_name"] == "Notification" and event["notification_type"] == "idle_prompt"
    term.send("/exit\r")
    assert term.wait() == 0
