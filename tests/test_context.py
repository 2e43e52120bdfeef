"""Context that lasts: project instructions (CLAUDE.md / AGENTS.md, @imports, the 40 kB cap) in a system prompt
built once; compaction by a summary (when usage nears the window, when the API refuses, on /compact), its
fallback to eliding, the model list; the Read short-cut for a file read before and unchanged since."""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.fake_openrouter import Raw, call, reply
from tests.conftest import PROMPT
from tests.test_session import user_turns

MODEL_ID = agent.DEFAULT_MODEL
ASK = 'Find the marker in notes.txt;\nsay it `exactly`: "quoted" & <tagged> \u2014 then stop.'  # kept word for word
SUMMARY = "SUMMARY-TEXT: the marker hunt so far."
TOO_LONG = ("This endpoint's maximum context length is 20000 tokens. However, you requested 30000 tokens.")
NOTE = "[{} has not changed since your earlier Read of these lines: that result is still current]"
SHRUNK = "old tool results with a short note and retrying"
GAVE_UP = "could not be summarised; it will be tried again once the conversation has grown"
COMPACTED = re.compile(r"^solo: compacted the conversation \((\w+)\): (\d+) -> (\d+) tokens$", re.M)


def files(root: Path, tree: dict[str, str]) -> None:
    """Make these files under root (a name ending in / is an empty folder)."""
    for name, text in tree.items():
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def system_of(body: dict) -> str:
    return body["messages"][0]["content"]


def is_summary(body: dict) -> bool:
    """A summary request: the only kind sent without tools."""
    return "tools" not in body


def compacted(body: dict) -> bool:
    """A request of a conversation our fake model has summarised."""
    return not is_summary(body) and len(body["messages"]) > 1 and SUMMARY in str(body["messages"][1]["content"])


def usage(prompt_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": 10, "total_tokens": prompt_tokens + 10, "cost": 0.001}


def size(body: dict) -> int:
    """A body's size in tokens as the agent guesses it (bytes / 4)."""
    return len(agent.encode(body)) // 4


def tool_contents(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def overflow(message: str = TOO_LONG) -> Raw:
    return Raw(400, {"error": {"code": 400, "message": message}})


# --- Instruction discovery ------------------------------------------------------------------------


@pytest.mark.parametrize("tree, cwd, found", [
    pytest.param({"home/.claude/CLAUDE.md": "", "repo/.git/": "", "repo/CLAUDE.md": "", "repo/.claude/CLAUDE.md": "",
                  "repo/AGENTS.md": "", "repo/a/AGENTS.md": "", "repo/a/b/CLAUDE.md": "", "repo/a/b/AGENTS.md": "",
                  "CLAUDE.md": "", "repo/a/other/CLAUDE.md": ""},
                 "repo/a/b",
                 ["home/.claude/CLAUDE.md", "CLAUDE.md", "repo/CLAUDE.md", "repo/.claude/CLAUDE.md", "repo/a/AGENTS.md",
                  "repo/a/b/CLAUDE.md"], id="home-then-above-the-root-then-git-root-down-to-cwd"),  # Claude Code's
    pytest.param({"repo/.git": "gitdir: /elsewhere\n", "repo/CLAUDE.md": "", "repo/w/CLAUDE.md": ""}, "repo/w",
                 ["repo/CLAUDE.md", "repo/w/CLAUDE.md"], id="a-.git-file-marks-a-worktree-root"),
    pytest.param({"outer/CLAUDE.md": "", "outer/AGENTS.md": "", "outer/inner/CLAUDE.md": "", "outer/inner/AGENTS.md": ""},
                 "outer/inner", ["outer/CLAUDE.md", "outer/inner/CLAUDE.md"],
                 id="no-repository-the-parents-claude-md-too"),  # as Claude Code reads them; AGENTS.md only below a root
    pytest.param({"repo/.git/": "", "repo/CLAUDE.local.md": "", "repo/AGENTS.md": "", "CLAUDE.local.md": ""}, "repo",
                 ["CLAUDE.local.md", "repo/AGENTS.md", "repo/CLAUDE.local.md"], id="claude-local-md-beside"),
    pytest.param({"w/AGENTS.md": ""}, "w", ["w/AGENTS.md"], id="agents-md-where-there-is-no-claude-md"),
    pytest.param({"w/.claude/CLAUDE.md": "", "w/AGENTS.md": ""}, "w", ["w/.claude/CLAUDE.md"],
                 id="dot-claude-counts-as-a-claude-md"),
    pytest.param({"w/README.md": ""}, "w", [], id="none"),
])
def test_instruction_files(tmp_path, tree, cwd, found):
    assert not any((p / ".git").exists() for p in tmp_path.parents)  # else "no repository" would not be true
    files(tmp_path, tree)
    assert [path for path, _ in agent.instruction_files(tmp_path / cwd, tmp_path / "home")] == [tmp_path / p for p in found]


def test_a_symlinked_claude_md_counts_once(tmp_path):
    files(tmp_path, {"w/AGENTS.md": "the rules", "w/.claude/": ""})
    (tmp_path / "w" / "CLAUDE.md").symlink_to("AGENTS.md")
    (tmp_path / "w" / ".claude" / "CLAUDE.md").symlink_to("../AGENTS.md")
    assert agent.instruction_files(tmp_path / "w", None) == [(tmp_path / "w" / "CLAUDE.md", tmp_path / "w")]
    cfg = agent.Config(api_key="k", cwd=tmp_path / "w")
    assert agent.project_instructions(cfg, print).count("the rules") == 1


def test_the_system_prompt_carries_each_file_with_its_path_in_order(serve, run, workspace):
    cwd, home = workspace / "pkg", workspace / "home"  # run() makes cwd.parent / "home" the HOME
    texts = {home / ".claude" / "CLAUDE.md": "HOME-RULE", workspace / "CLAUDE.md": "ROOT-RULE",
             workspace / ".claude" / "CLAUDE.md": "ROOT-DOT-RULE", cwd / "AGENTS.md": "PKG-AGENTS-RULE"}
    files(workspace, {".git/": "", "AGENTS.md": "IGNORED-ROOT-AGENTS", "pkg/.claude/": ""})
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "hi"], cwd=cwd, base_url=server.url)
    assert (result.code, result.stdout) == (0, "ok\n")
    system = system_of(server.bodies[0])
    blocks = [f'<instructions file="{path}">\n{text}\n</instructions>' for path, text in texts.items()]
    places = [system.find(block) for block in blocks]
    assert -1 not in places and places == sorted(places), system
    assert "IGNORED-ROOT-AGENTS" not in system
    said = system.find("they come from the user: follow them")
    assert 0 < said < places[0]


def test_no_files_or_the_flag_add_nothing_to_the_system_prompt(serve, run, workspace):
    def without_date(text: str) -> str:
        return re.sub(r"Date: \S+", "", text)
    server = serve(lambda body: reply("ok"))
    (workspace / "CLAUDE.md").write_text("PROJECT-RULE\n")
    run(["-p", "hi"], cwd=workspace, base_url=server.url)
    run(["-p", "hi", "--no-project-instructions"], cwd=workspace, base_url=server.url)
    (workspace / "CLAUDE.md").unlink()
    run(["-p", "hi"], cwd=workspace, base_url=server.url)
    with_file, flag, none = (without_date(system_of(body)) for body in server.bodies)
    assert "PROJECT-RULE" in with_file and "come from the user" in with_file
    assert flag == none and "<instructions" not in none and "come from the user" not in none


# --- @imports -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree, text, expanded", [
    pytest.param({"proj/docs/style.md": "STYLE\n"}, "See @docs/style.md\n", "See STYLE\n\n", id="relative"),
    pytest.param({"proj/docs/a.md": "A @b.md", "proj/docs/b.md": "B", "proj/b.md": "WRONG-B"}, "@docs/a.md",
                 "A B", id="relative-to-the-importing-file"),
    pytest.param({"proj/up.md": "UP"}, "@./up.md and @../proj/up.md", "UP and UP", id="dot-paths"),
    pytest.param({"home/.claude/mine.md": "MINE"}, "@~/.claude/mine.md", "MINE", id="home"),
    pytest.param({"abs/x.md": "ABSOLUTE"}, "@{tmp}/abs/x.md", "ABSOLUTE", id="absolute"),
    pytest.param({}, "Use @nope.md now", "Use [@nope.md: not found] now", id="missing"),
    pytest.param({"proj/a.md": "A @b.md", "proj/b.md": "B @a.md"}, "@a.md",
                 "A B [@a.md: not imported, it imports itself]", id="cycle"),
    pytest.param({}, "me: @CLAUDE.md", "me: [@CLAUDE.md: not imported, it imports itself]", id="self"),
    pytest.param({f"proj/l{n}.md": f"{n} @l{n + 1}.md" for n in range(1, 8)}, "@l1.md",
                 "1 2 3 4 5 [@l6.md: not imported, imports nest too deep]", id="five-levels-deep"),
    pytest.param({"proj/x.md": "X"}, "run `@x.md` and `cat @x.md` as is", "run `@x.md` and `cat @x.md` as is",
                 id="code-spans"),
    pytest.param({"proj/x.md": "X"}, "```sh\necho @x.md\n```\n~~~\n@x.md\n~~~\n@x.md\n",
                 "```sh\necho @x.md\n```\n~~~\n@x.md\n~~~\nX\n", id="fenced-blocks"),
    pytest.param({"proj/x.md": "X"}, "run `` @x.md `` as is", "run `` @x.md `` as is",
                 id="double-backtick-code-span"),
    pytest.param({"proj/example.com": "HIJACKED"}, "mail bob@example.com or a@b.md", "mail bob@example.com or a@b.md",
                 id="email-addresses"),
])
def test_expand_imports(tmp_path, tree, text, expanded):
    files(tmp_path, tree)
    folder = tmp_path / "proj"
    folder.mkdir(exist_ok=True)
    text = text.replace("{tmp}", str(tmp_path))
    within = tmp_path  # the folder imports must stay in (the repository; here all of the test's files)
    assert agent.expand_imports(text, folder, tmp_path / "home", ((folder / "CLAUDE.md").resolve(),), within) == expanded


def test_imports_end_to_end(serve, run, workspace, tmp_path):
    home = workspace.parent / "home"
    files(workspace, {"CLAUDE.md": f"Rules: @docs/rules.md, @~/personal.md, @{tmp_path}/shared/team.md, @gone.md\n"
                                   "Write to bob@example.com; keep `@docs/rules.md` literal.\n",
                      "docs/rules.md": "RULES-TEXT from @more.md", "docs/more.md": "MORE-TEXT"})
    files(home, {"personal.md": "PERSONAL-TEXT"})
    files(tmp_path, {"shared/team.md": "TEAM-TEXT"})
    server = serve(lambda body: reply("ok"))
    assert run(["-p", "hi"], cwd=workspace, base_url=server.url).code == 0  # from outside: only once approved
    refused = f"not imported, it is outside {workspace} and the user has not approved this project's imports from " \
              "outside"
    block = (f'<instructions file="{workspace / "CLAUDE.md"}">\n'
             f"Rules: RULES-TEXT from MORE-TEXT, [@~/personal.md: {refused}], [@{tmp_path}/shared/team.md: {refused}], "
             "[@gone.md: not found]\nWrite to bob@example.com; keep `@docs/rules.md` literal.\n</instructions>")
    assert block in system_of(server.bodies[0])
    outside = sorted(os.path.realpath(path) for path in (home / "personal.md", tmp_path / "shared" / "team.md"))
    agent.approve(home / ".solo", workspace, "imports", outside, True)  # what answering y in a session records
    assert run(["-p", "hi"], cwd=workspace, base_url=server.url).code == 0
    block = (f'<instructions file="{workspace / "CLAUDE.md"}">\n'
             "Rules: RULES-TEXT from MORE-TEXT, PERSONAL-TEXT, TEAM-TEXT, [@gone.md: not found]\n"
             "Write to bob@example.com; keep `@docs/rules.md` literal.\n</instructions>")
    assert block in system_of(server.bodies[1])


def test_an_import_of_a_fifo_does_not_hang_the_start(serve, run, workspace):
    os.mkfifo(workspace / "pipe")
    (workspace / "CLAUDE.md").write_text("Rules.\n@pipe\n")
    server = serve(lambda body: reply("ok"))
    result = run(["-p", "hi"], cwd=workspace, base_url=server.url, timeout=10)  # a hang is killed at 10 s
    assert (result.code, result.stdout) == (0, "ok\n")
    assert "Rules." in system_of(server.bodies[0])


def test_imports_that_fan_out_do_not_hang_the_start(serve, run, workspace):
    """A cloned project's few small files, each importing the next twenty times, would expand 20^5 times."""
    files(workspace, {"CLAUDE.md": "Rules.\n" + "@l1.md\n" * 20,
                      **{f"l{n}.md": f"L{n}\n" + f"@l{n + 1}.md\n" * 20 for n in range(1, 5)}, "l5.md": "X" * 100})
    server = serve(lambda body: reply("ok"))
    started = time.monotonic()
    result = run(["-p", "hi"], cwd=workspace, base_url=server.url, timeout=30)  # before: minutes, gigabytes
    assert (result.code, result.stdout) == (0, "ok\n") and time.monotonic() - started < 10
    system = system_of(server.bodies[0])
    assert "Rules.\nL1\nL2\nL3\nL4\nXXX" in system and "not imported" in system
    assert len(system.encode()) < 2 * agent.INSTRUCTIONS_LIMIT


# --- The 40 kB cap, the flags ---------------------------------------------------------------------


def test_the_cap_holds_the_total_and_names_what_was_cut(tmp_path):
    files(tmp_path, {"home/.claude/CLAUDE.md": "H" * 30_000, "w/CLAUDE.md": "W" * 30_000,
                     "w/.claude/CLAUDE.md": "LATE"})
    notices: list[str] = []
    cfg = agent.Config(api_key="k", cwd=tmp_path / "w", home=tmp_path / "home")
    text = agent.project_instructions(cfg, notices.append)
    assert "H" * 30_000 in text and "W" * 9_000 in text and "W" * 30_000 not in text and "LATE" not in text
    assert len(text.encode()) <= agent.INSTRUCTIONS_LIMIT == 40_000
    assert notices == [f"project instructions are limited to 40000 bytes: cut {tmp_path / 'w' / 'CLAUDE.md'}, "
                       f"{tmp_path / 'w' / '.claude' / 'CLAUDE.md'}"]


def test_a_file_over_a_megabyte_is_cut_like_any_other_not_dropped_unsaid(tmp_path):
    files(tmp_path, {"w/CLAUDE.md": "FIRST-RULE\n" + "W" * 1_100_000})
    notices: list[str] = []
    cfg = agent.Config(api_key="k", cwd=tmp_path / "w", home=tmp_path / "home")
    text = agent.project_instructions(cfg, notices.append)
    assert "FIRST-RULE\n" + "W" * 30_000 in text and len(text.encode()) <= agent.INSTRUCTIONS_LIMIT
    assert notices == [f"project instructions are limited to 40000 bytes: cut {tmp_path / 'w' / 'CLAUDE.md'}"]


def test_the_cap_end_to_end_and_the_flags(serve, run, workspace):
    big, late = workspace / "CLAUDE.md", workspace / ".claude" / "CLAUDE.md"
    files(workspace, {"CLAUDE.md": "B" * 60_000, ".claude/CLAUDE.md": "LATE-RULE"})
    server = serve(lambda body: reply("ok"))
    capped = run(["-p", "hi", "--verbose"], cwd=workspace, base_url=server.url)
    off = run(["-p", "hi", "--verbose", "--no-project-instructions"], cwd=workspace, base_url=server.url)
    assert capped.code == off.code == 0
    instructions = system_of(server.bodies[0]).split("follow them.\n\n", 1)[1]
    assert 39_000 < len(instructions.encode()) <= 40_000 and "LATE-RULE" not in instructions
    assert f"solo: project instructions are limited to 40000 bytes: cut {big}, {late}\n" in capped.stderr
    assert f"solo: project instructions: {big}\n" in capped.stderr
    assert "B" * 100 not in system_of(server.bodies[1]) and "project instructions" not in off.stderr


# --- The system prompt is built once --------------------------------------------------------------


def test_a_claude_md_changed_during_a_run_leaves_the_system_message_as_it_was(serve, run, workspace):
    (workspace / "CLAUDE.md").write_text("VERSION-ONE\n")

    def model(body):
        if body["messages"][-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "echo VERSION-TWO > CLAUDE.md"})])
        return reply("done")
    server = serve(model)
    result = run(["-p", "change the rules"], cwd=workspace, base_url=server.url)
    assert result.code == 0 and (workspace / "CLAUDE.md").read_text() == "VERSION-TWO\n"
    assert "VERSION-ONE" in system_of(server.bodies[0]) and system_of(server.bodies[1]) == system_of(server.bodies[0])
    assert server.raw[1].startswith(server.raw[0][:-2] + b",")  # the whole first request is the second's prefix


def test_a_claude_md_changed_between_session_turns_leaves_the_system_message(serve, terminal, workspace):
    (workspace / "CLAUDE.md").write_text("SESSION-ONE\n")
    server = serve(lambda body: reply(f"answer {len(user_turns(body))}"))
    term = terminal(server)
    term.ask("first", "answer 1")
    (workspace / "CLAUDE.md").write_text("SESSION-TWO\n")
    term.ask("second", "answer 2")
    assert "SESSION-ONE" in system_of(server.bodies[0]) and system_of(server.bodies[1]) == system_of(server.bodies[0])
    term.send("\x04")
    assert term.wait() == 0


# --- Compaction: the pure parts -------------------------------------------------------------------


def test_history_text_is_the_conversation_as_plain_text():
    messages = [{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None,
                 "tool_calls": [call("Read", {"file_path": "a.txt"}, id="r"), call("Bash", {"command": "ls"}, id="b")]},
                {"role": "tool", "tool_call_id": "r", "content": "A"},
                {"role": "tool", "tool_call_id": "b", "content": "B"},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    assert agent.history_text(messages, 10_000) == (
        '[user]\nhi\n\n[assistant]\n\n[calls Read {"file_path": "a.txt"}]\n[calls Bash {"command": "ls"}]\n\n'
        "[tool]\nA\n\n[tool]\nB\n\n[assistant]\ndone")


def test_history_text_cuts_the_largest_tool_results_first():
    request, small = "the request " * 30, "small result " * 30
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": request},
                {"role": "assistant", "content": None, "tool_calls": [call("Read", {"file_path": "big"}, id="1")]},
                {"role": "tool", "tool_call_id": "1", "content": "<" + "x" * 100_000 + ">"},
                {"role": "assistant", "content": None, "tool_calls": [call("Read", {"file_path": "mid"}, id="2")]},
                {"role": "tool", "tool_call_id": "2", "content": "[" + "y" * 20_000 + "]"},
                {"role": "assistant", "content": None, "tool_calls": [call("Bash", {"command": "ls"}, id="3")]},
                {"role": "tool", "tool_call_id": "3", "content": small}]
    text = agent.history_text(messages, 12_000)
    assert len(text) <= 12_000
    assert f"[user]\n{request}\n\n" in text and f"[tool]\n{small}" in text  # whole
    assert text.count("characters omitted") == 2 and "<xxx" in text and "xxx>" in text and "[yyy" in text


@pytest.mark.parametrize("window, compact_at, after, tokens, due", [
    (20_000, 0.8, 0, 13_999, False),  # 13,999 + 2,000 for the answer is not past 16,000
    (20_000, 0.8, 0, 14_001, True),
    (20_000, 0.5, 0, 8_001, True),
    (20_000, 1.0, 0, 19_999, False),  # 1: never
    (20_000, 0.8, 14_000, 15_000, False),  # grew less than a tenth of the window since the last compaction
    (20_000, 0.8, 14_000, 16_001, True),
    (200_000, 0.8, 0, 143_999, False),  # the room for the answer stops at 16,000
    (200_000, 0.8, 0, 144_001, True),
])
def test_due(tmp_path, window, compact_at, after, tokens, due):
    cfg = agent.Config(api_key="k", cwd=tmp_path, context_window=window, compact_at=compact_at)
    compactor = agent.Compactor(model=None, info=lambda model: pytest.fail("the list was asked"), emit=print)
    compactor.after = after
    assert compactor.due(cfg, tokens) is due


@pytest.mark.parametrize("entry, tokens, asked, window", [
    ({"context_length": 200_000}, 29_998, 0, None),  # not worth asking yet
    ({"context_length": 200_000}, 30_001, 1, 200_000),
    ({"context_length": 40_000, "top_provider": {"context_length": 36_000}}, 30_001, 1, 36_000),
    ({"context_length": None, "top_provider": {"context_length": None}}, 30_001, 1, 128_000),  # the default
    ({}, 30_001, 1, 128_000),  # the default
])
def test_the_window_comes_from_the_model_list_past_30000_tokens(tmp_path, entry, tokens, asked, window):
    calls, cfg = [], agent.Config(api_key="k", cwd=tmp_path)
    compactor = agent.Compactor(None, lambda model: calls.append(model) or entry, print)
    compactor.due(cfg, tokens)
    compactor.due(cfg, tokens + 1)
    assert (len(calls), compactor.windows.get(cfg.model)) == (asked, window)


@pytest.mark.parametrize("message, window", [
    ("HTTP 400: " + TOO_LONG, 20_000),
    ("HTTP 400: This model's maximum context length is 128,000 tokens. However, your messages resulted in 130,512",
     128_000),
    ("HTTP 400: input exceeds the context window of 8192 tokens", 8_192),
    ("HTTP 400: prompt is too long", None),
])
def test_learn_takes_the_window_from_the_refusal(tmp_path, message, window):
    cfg = agent.Config(api_key="k", cwd=tmp_path)
    compactor = agent.Compactor(None, lambda model: {}, print)
    compactor.learn(cfg, agent.ContextOverflow(message))
    assert compactor.windows.get(cfg.model) == window


@pytest.mark.parametrize("env, compact_at", [({}, 0.8), ({"SOLO_COMPACT_AT": "0.5"}, 0.5),
                                             ({"SOLO_COMPACT_AT": "1"}, 1.0), ({"SOLO_COMPACT_AT": "3"}, 1.0)])
def test_solo_compact_at(tmp_path, env, compact_at):
    cfg = agent.build_config(agent.parse_args(["-p", "x", "--context-window", "20000"]),
                             {"OPENROUTER_API_KEY": "k", **env}, tmp_path)
    assert (cfg.compact_at, cfg.context_window) == (compact_at, 20_000)


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_solo_compact_at_must_be_above_zero(serve, run, workspace, value):
    server = serve(lambda body: reply("never"))
    result = run(["-p", "x"], cwd=workspace, base_url=server.url, env={"SOLO_COMPACT_AT": value})
    assert result.code == 2 and "SOLO_COMPACT_AT must be a number above zero" in result.stderr and not server.bodies


# --- Compaction in the loop (a scripted model) ----------------------------------------------------


def loop(tmp_path: Path, model, messages: list[dict], events: list, *, compactor: agent.Compactor | None = None,
         **overrides) -> agent.Outcome:
    """One turn of run_agent with a compactor, as Agent.run does it (a session keeps one across its turns)."""
    cfg = agent.Config(api_key="k", cwd=tmp_path, tools=("Read", "Write", "Edit", "Bash"), **overrides)
    tools = {t.name: t for t in agent.TOOLS if t.name in cfg.tools}
    compactor = compactor or agent.Compactor(model, lambda name: {}, events.append)
    return agent.run_agent(cfg, messages, model=model, tools=tools, ctx=agent.ToolContext(cwd=tmp_path, env={}),
                           usage=agent.Usage(), emit=events.append, compactor=compactor)


def recorded(answer):
    """A model from a function of the body, recording each body it was sent."""
    def model(body):
        model.sent.append(json.loads(agent.encode(body)))
        return answer(body)
    model.sent = []
    return model


def test_a_failed_summary_is_not_asked_again_before_the_conversation_grows(tmp_path):
    """Usage stays at 17,000 of 20,000 tokens: one failed summary, not one at every turn."""
    def answer(body):
        if is_summary(body):
            return reply("")
        if len(tool_contents(body)) < 6:
            return reply(tool_calls=[call("Bash", {"command": "true"})], usage=usage(17_000))
        return reply("done", usage=usage(17_000))
    model, events = recorded(answer), []
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    outcome = loop(tmp_path, model, messages, events, context_window=20_000)
    assert outcome.answer == "done" and [is_summary(b) for b in model.sent].count(True) == 1
    notices = [e["text"] for e in events if e["type"] == "notice"]
    assert sum(GAVE_UP in n for n in notices) == 1 and len(model.sent) == 8


def test_failing_summaries_back_off_cut_old_results_meanwhile_and_are_asked_again(tmp_path):
    """Against a server that never refuses, two failed summaries once stopped compaction for good and let a
    4,000-token window grow without bound (issue 21, item 8)."""
    summaries = itertools.chain(["", ""], itertools.repeat(SUMMARY))  # the backend recovers at the third try

    def answer(body):
        if is_summary(body):
            return reply(next(summaries))
        if sum(not is_summary(b) for b in model.sent) <= 40:
            return reply(tool_calls=[call("Bash", {"command": "printf '%01000d' 0"})], usage=usage(size(body)))
        return reply("done", usage=usage(size(body)))
    model, events = recorded(answer), []
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": ASK}]
    assert loop(tmp_path, model, messages, events, context_window=4_000).answer == "done"
    assert [is_summary(b) for b in model.sent].count(True) >= 3 and compacted(model.sent[-1])
    assert max(size(b) for b in model.sent if not is_summary(b)) < 4_000  # 40 results of 1,000 characters: 10,000
    notices = [e["text"] for e in events if e["type"] == "notice"]
    assert sum(GAVE_UP in n for n in notices) == 2 and any("old tool results were replaced" in n for n in notices)


def test_a_window_smaller_than_the_fixed_part_is_said_plainly_and_no_summary_is_asked(tmp_path):
    """A conversation that compacting would make bigger, and three summaries paid for in vain (issue 21, item 9)."""
    model = recorded(lambda body: reply(SUMMARY) if is_summary(body) else reply(
        "done", usage=usage(size(body))) if tool_contents(body) else reply(
        tool_calls=[call("Bash", {"command": "true"})], usage=usage(size(body))))
    events: list = []
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": ASK}]
    assert loop(tmp_path, model, messages, events, context_window=600).answer == "done"
    assert not any(is_summary(b) for b in model.sent)
    notices = [e["text"] for e in events if e["type"] == "notice"]
    assert len(notices) == 1 and notices[0].startswith("the context window of 600 tokens cannot hold even the "
                                                       "system prompt, the tools and the latest request (about ")


def test_a_second_compaction_keeps_one_summary_and_the_request_once(tmp_path):
    summaries = iter(["FIRST-SUMMARY", "SECOND-SUMMARY"])

    def answer(body):
        if is_summary(body):
            return reply(next(summaries))
        if len(tool_contents(body)) < 2:
            return reply(tool_calls=[call("Bash", {"command": "echo step"})], usage=usage(17_000))
        return reply("done")
    model = recorded(answer)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": ASK}]
    outcome = loop(tmp_path, model, messages, [], context_window=20_000)
    assert outcome.answer == "done"
    assert [is_summary(b) for b in model.sent] == [False, True, False, True, False]
    summary_message = model.sent[-1]["messages"][1]["content"]
    assert "SECOND-SUMMARY" in summary_message and summary_message.count(ASK) == 1
    assert "FIRST-SUMMARY" not in summary_message  # the second summary was made from the first: it stands alone


def test_a_conversation_past_the_threshold_is_compacted_before_the_next_turn(tmp_path):
    """A session runs the loop once per prompt: the last turn's usage must still count at the next one."""
    model = recorded(lambda body: reply(SUMMARY) if is_summary(body) else reply("answer", usage=usage(17_000)))
    events: list = []
    compactor = agent.Compactor(model, lambda name: {}, events.append)
    messages = agent.Conversation([{"role": "system", "content": "s"}, {"role": "user", "content": "first"}])
    loop(tmp_path, model, messages, events, context_window=20_000, compactor=compactor)
    messages.append({"role": "user", "content": "second"})
    loop(tmp_path, model, messages, events, context_window=20_000, compactor=compactor)
    assert [is_summary(b) for b in model.sent] == [False, True, False]


def test_manual_compaction_works_when_automatic_is_off(tmp_path):
    model, events = recorded(lambda body: reply(SUMMARY)), []
    cfg = agent.Config(api_key="k", cwd=tmp_path, context_window=20_000, compact_at=1.0)
    compactor = agent.Compactor(model, lambda name: {}, events.append)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": ASK},
                {"role": "assistant", "content": "an answer"}]
    assert compactor.compact(cfg, list(messages), 100) is False and model.sent == []
    assert compactor.compact(cfg, messages, 100, "manual", "the fruit") is True
    assert model.sent[0]["messages"][1]["content"].endswith(" Focus on: the fruit")
    assert messages[0] == {"role": "system", "content": "s"}
    assert messages[2] == {"role": "assistant", "content": "an answer"}
    assert SUMMARY in messages[1]["content"] and messages[1]["content"].endswith("\n" + ASK)
    assert events[-1]["type"] == "compact_boundary" and events[-1]["trigger"] == "manual"


# --- Compaction end to end ------------------------------------------------------------------------


def usage_script(body):
    """Read a big file, then run a small command (the reply that passes 80% of a 20,000 window), then answer."""
    if is_summary(body):
        return reply(SUMMARY)
    if compacted(body):
        return reply("done")
    if not tool_contents(body):
        return reply(tool_calls=[call("Read", {"file_path": "big.txt"}, id="c1")], usage=usage(1_000))
    return reply(tool_calls=[call("Bash", {"command": "echo small-result"}, id="c2")], usage=usage(17_000))


def test_usage_past_80_percent_compacts_before_the_next_request(serve, run, workspace):
    big = "".join(f"line {n:05} " + "b" * 88 + "\n" for n in range(240))  # 24,000 characters
    (workspace / "big.txt").write_text(big)
    server = serve(usage_script)
    result = run(["-p", ASK, "--context-window", "20000", "--output-format", "stream-json"],
                 cwd=workspace, base_url=server.url)
    assert result.code == 0
    assert [is_summary(b) for b in server.bodies] == [False, False, True, False]
    ask_summary, after = server.bodies[2], server.bodies[3]["messages"]
    assert [m["role"] for m in ask_summary["messages"]] == ["system", "user"]
    history = ask_summary["messages"][1]["content"]
    assert ASK in history and "[calls Read" in history and "small-result" in history and big[:500] in history
    assert after[0] == server.bodies[0]["messages"][0]
    assert after[1]["role"] == "user" and SUMMARY in after[1]["content"] and after[1]["content"].endswith("\n" + ASK)
    assert [m["role"] for m in after] == ["system", "user", "assistant", "tool"]
    assert after[2]["tool_calls"][0]["id"] == "c2" and after[3] == {"role": "tool", "tool_call_id": "c2",
                                                                   "content": "small-result\n[exit code 0]"}
    assert "line 00001" not in json.dumps(after)  # the big result did not fit a quarter of the window
    lines = COMPACTED.findall(result.stderr)
    assert len(lines) == 1 and lines[0][:2] == ("auto", "17000") and int(lines[0][2]) < 17_000
    events = [json.loads(line) for line in result.stdout.splitlines()]
    boundary = [e for e in events if e.get("subtype") == "compact_boundary"]
    assert len(boundary) == 1 and boundary[0]["type"] == "system"
    assert (boundary[0]["trigger"], boundary[0]["tokens_before"], boundary[0]["tokens_after"]) == (
        "auto", 17_000, int(lines[0][2]))
    assert events[-1]["result"] == "done"
    transcripts = list((workspace.parent / "home" / ".solo" / "projects").glob("*/*.jsonl"))
    assert len(transcripts) == 1
    entries = [json.loads(line) for line in transcripts[0].read_text().splitlines()]
    assert {"type": "compact", "trigger": "auto", "tokens_before": 17_000} in entries
    resumed, _ = agent.read_transcript(transcripts[0].read_bytes(), transcripts[0], print)
    assert [agent.sendable(m) for m in resumed[:4]] == after and resumed[4]["content"] == "done"
    assert resumed[1]["prompt_id"] == 1  # the summary names the prompt it stands for; the API never sees it


def test_the_window_from_the_model_list_triggers_compaction(serve, run, workspace):
    def model(body):
        if is_summary(body):
            return reply(SUMMARY)
        if compacted(body) or tool_contents(body):
            return reply("done" if compacted(body) else "not compacted")
        return reply(tool_calls=[call("Bash", {"command": "echo hi"})], usage=usage(31_000))
    listed = [{"id": "other/model", "context_length": 1_000},
              {"id": MODEL_ID, "context_length": 40_000, "top_provider": {"context_length": 36_000}}]
    server = serve(model, models=listed)
    result = run(["-p", ASK], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n")
    assert server.gets == ["/api/v1/models"] and [is_summary(b) for b in server.bodies] == [False, True, False]


def test_summary_requests_count_in_the_usage(serve, run, workspace):
    (workspace / "big.txt").write_text("b" * 24_000)
    server = serve(usage_script)
    result = run(["-p", ASK, "--context-window", "20000", "--output-format", "json"],
                 cwd=workspace, base_url=server.url)
    obj = json.loads(result.stdout)
    assert result.code == 0 and any(is_summary(b) for b in server.bodies)
    assert obj["usage"]["requests"] == len(server.bodies)
    assert obj["total_cost_usd"] == pytest.approx(0.001 * len(server.bodies))


@pytest.mark.parametrize("message, asks", [(TOO_LONG, False), ("prompt is too long", True)])
def test_a_context_length_refusal_compacts_and_the_request_succeeds(serve, run, workspace, message, asks):
    """The fake model has a 20,000-token window: it refuses anything bigger, the summary request included."""
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text("".join(f"{name} {n:04} " + "y" * 89 + "\n" for n in range(500)))

    def model(body):
        if size(body) > 20_000:
            return overflow(message)
        if is_summary(body):
            return reply(SUMMARY)
        if compacted(body):
            return reply("done")
        return reply(tool_calls=[call("Read", {"file_path": "a.txt"}), call("Read", {"file_path": "b.txt"})])
    listed = [{"id": MODEL_ID, "context_length": 20_000, "top_provider": {"context_length": None}}]
    server = serve(model, models=listed)
    result = run(["-p", ASK], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n"), result.stderr
    assert [is_summary(b) for b in server.bodies] == [False, False, True, False]
    assert size(server.bodies[1]) > 20_000 >= size(server.bodies[2])  # refused, then a summary that fits
    assert "characters omitted" in server.bodies[2]["messages"][1]["content"]
    assert server.bodies[3]["messages"][1]["content"].endswith("\n" + ASK)
    assert COMPACTED.findall(result.stderr)[0][0] == "auto" and SHRUNK not in result.stderr
    assert server.gets == (["/api/v1/models"] if asks else [])  # the refusal said the window


def test_the_summary_request_fits_the_window_however_large_the_old_results(serve, run, workspace):
    for name in ("a.txt", "b.txt", "c.txt"):
        (workspace / name).write_text("".join(f"{name} {n:04} " + "z" * 89 + "\n" for n in range(400)))
    refused = []

    def model(body):
        if size(body) > 24_000:
            refused.append(body)
            return overflow(TOO_LONG.replace("20000", "24000"))
        if is_summary(body):
            return reply(SUMMARY, usage=usage(size(body)))
        if compacted(body):
            return reply("done")
        read = len(tool_contents(body))
        return reply(tool_calls=[call("Read", {"file_path": "abc"[read] + ".txt"})], usage=usage(size(body)))
    server = serve(model)
    result = run(["-p", ASK, "--context-window", "24000"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n") and refused == []
    summary = [b for b in server.bodies if is_summary(b)]
    assert len(summary) == 1 and size(summary[0]) <= 24_000
    history = summary[0]["messages"][1]["content"]
    assert ASK in history and history.count("characters omitted") == 3  # each of the three results, none whole
    assert sum(p.stat().st_size for p in workspace.glob("?.txt")) > 24_000 * 4  # whole, they would not fit


# --- The model list -------------------------------------------------------------------------------


def climbing(tokens: list[int]):
    """A model whose replies report these prompt sizes, one a turn, then answers."""
    def model(body):
        step = len(tool_contents(body))
        if step < len(tokens) - 1:
            return reply(tool_calls=[call("Bash", {"command": "true"})], usage=usage(tokens[step]))
        return reply("done", usage=usage(tokens[-1]))
    return model


def test_the_model_list_is_asked_once_a_conversation_passes_30000_tokens(serve, run, workspace):
    asked = []  # how many times the list had been asked when each request came
    script = climbing([10_000, 29_999, 31_000, 32_000, 33_000])
    server = serve(lambda body: asked.append(len(server.gets)) or script(body),
                   models=[{"id": MODEL_ID, "context_length": 200_000}])
    result = run(["-p", "go"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n")
    assert asked == [0, 0, 0, 1, 1] and server.gets == ["/api/v1/models"]
    assert not any(is_summary(b) for b in server.bodies)  # 33,000 of 200,000 is not worth a compaction


def test_the_model_list_is_kept_a_day_under_solo_home(serve, run, workspace, tmp_path):
    solo_home = tmp_path / "solo-home"
    server = serve(climbing([31_000, 32_000]), models=[{"id": MODEL_ID, "context_length": 200_000}])
    env = {"SOLO_HOME": str(solo_home)}
    for _ in range(2):
        assert run(["-p", "go"], cwd=workspace, base_url=server.url, env=env).code == 0
    assert len(server.gets) == 1 and len(server.bodies) == 4
    cache = json.loads((solo_home / "models.json").read_text())
    entry = cache[f"{server.url} {MODEL_ID}"]
    assert entry["info"]["context_length"] == 200_000 and time.time() - entry["time"] < 3_600
    entry["time"] -= agent.MODEL_LIST_SECONDS + 60
    (solo_home / "models.json").write_text(json.dumps(cache))
    assert run(["-p", "go"], cwd=workspace, base_url=server.url, env=env).code == 0
    assert len(server.gets) == 2


# --- Failure fallback -----------------------------------------------------------------------------


@pytest.mark.parametrize("summary_answer", [
    reply(""), Raw(400, {"error": {"code": 400, "message": "Provider returned error"}})], ids=["empty", "refused"])
def test_a_failed_summary_falls_back_to_eliding_and_is_not_asked_again_at_once(serve, run, workspace,
                                                                               summary_answer):
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text(name * 1_000)
    kinds = []

    def model(body):
        if is_summary(body):
            kinds.append("summary")
            return summary_answer
        if any(len(c) > agent.STUB_MIN_CHARS for c in tool_contents(body)):
            kinds.append("refused")
            return overflow()
        kinds.append("real")
        if tool_contents(body):
            return reply("done")
        return reply(tool_calls=[call("Read", {"file_path": "a.txt"}), call("Read", {"file_path": "b.txt"})])
    server = serve(model)
    result = run(["-p", ASK], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n")
    assert kinds == ["real", "refused", "summary", "refused", "real"]
    assert result.stderr.count(GAVE_UP) == 1 and result.stderr.count(SHRUNK) == 2
    assert result.stderr.index(GAVE_UP) < result.stderr.rindex(SHRUNK) and not COMPACTED.search(result.stderr)


def test_a_conversation_that_never_fits_ends_after_a_few_requests(serve, run, workspace):
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text(name * 1_000)

    def model(body):
        if not is_summary(body) and not tool_contents(body):
            return reply(tool_calls=[call("Read", {"file_path": "a.txt"}), call("Read", {"file_path": "b.txt"})])
        return overflow()
    server = serve(model)
    result = run(["-p", ASK], cwd=workspace, base_url=server.url, timeout=30)
    assert result.code == 1 and "maximum context length" in result.stderr.splitlines()[-1]
    assert [is_summary(b) for b in server.bodies].count(True) == 1
    assert len(server.bodies) <= 1 + (agent.SHRINK_ATTEMPTS + 1) + 1


# --- SOLO_COMPACT_AT=1 ----------------------------------------------------------------------------


def test_compact_at_1_never_summarises_and_a_refusal_elides(serve, run, workspace):
    for name in ("a.txt", "b.txt"):
        (workspace / name).write_text(name * 1_000)

    def model(body):
        if any(len(c) > agent.STUB_MIN_CHARS for c in tool_contents(body)):
            return overflow()
        if tool_contents(body):
            return reply("done", usage=usage(19_000))
        return reply(tool_calls=[call("Read", {"file_path": "a.txt"}), call("Read", {"file_path": "b.txt"})],
                     usage=usage(19_000))
    server = serve(model, models=[{"id": MODEL_ID, "context_length": 20_000}])
    result = run(["-p", ASK, "--context-window", "20000"], cwd=workspace, base_url=server.url,
                 env={"SOLO_COMPACT_AT": "1"})
    assert (result.code, result.stdout) == (0, "done\n")
    assert not any(is_summary(b) for b in server.bodies) and len(server.bodies) == 4
    assert result.stderr.count(SHRUNK) == 2 and not COMPACTED.search(result.stderr) and server.gets == []


# --- /compact in a session ------------------------------------------------------------------------


def session_model(body):
    if is_summary(body):
        return reply("SESSION-SUMMARY")
    return reply(f"answer to {user_turns(body)[-1].splitlines()[-1]}")


def test_compact_in_a_session_summarises_with_the_focus(serve, terminal):
    server = serve(session_model)
    term = terminal(server)
    term.ask("remember PINEAPPLE", "answer to remember PINEAPPLE")
    term.send("/compact keep the fruit names\r")
    done = term.expect(PROMPT)
    assert re.search(r"compacted the conversation \(manual\): \d+ -> \d+ tokens", done), done
    term.ask("and now?", "answer to and now")
    assert [is_summary(b) for b in server.bodies] == [False, True, False]
    ask = server.bodies[1]["messages"][1]["content"]
    assert "remember PINEAPPLE" in ask and ask.endswith(" Focus on: keep the fruit names")
    after = server.bodies[2]["messages"]
    assert after[0] == server.bodies[0]["messages"][0]
    assert [m["role"] for m in after] == ["system", "user", "assistant", "user"]
    assert "SESSION-SUMMARY" in after[1]["content"] and after[1]["content"].endswith("\nremember PINEAPPLE")
    assert after[2]["content"] == "answer to remember PINEAPPLE" and after[3] == {"role": "user", "content": "and now?"}
    term.send("\x04")
    assert term.wait() == 0


def test_the_summary_goes_to_the_model_in_use(serve, terminal):
    server = serve(session_model)
    term = terminal(server)
    term.ask("/model anthropic/claude-haiku-next", "model: anthropic/claude-haiku-next")
    term.ask("hello", "answer to hello")
    term.send("/compact\r")
    term.expect(PROMPT)
    assert [is_summary(b) for b in server.bodies] == [False, True]
    assert [b["model"] for b in server.bodies] == ["anthropic/claude-haiku-next"] * 2
    term.send("\x04")
    assert term.wait() == 0


def test_a_turn_that_fails_after_compacting_leaves_a_valid_conversation(serve, terminal):
    """A failed turn is taken back (del messages[mark:]); if it compacted, what is left must still be valid."""
    def model(body):
        if is_summary(body):
            return reply("SESSION-SUMMARY")
        messages = body["messages"]
        answered = {m.get("tool_call_id") for m in messages}
        if any(c["id"] not in answered for m in messages for c in m.get("tool_calls") or []):
            return Raw(400, {"error": {"code": 400, "message": "tool_use ids were found without tool_result blocks"}})
        turn = user_turns(body)[-1]
        if turn == "work" and messages[-1]["role"] == "user":  # past 80% of the default window
            return reply(tool_calls=[call("Bash", {"command": "echo worked"})], usage=usage(120_000))
        if messages[-1]["role"] == "tool":
            return Raw(400, {"error": {"code": 400, "message": "Provider returned error"}})
        return reply(f"answer to {turn.splitlines()[-1]}")
    server = serve(model)
    term = terminal(server)
    term.ask("hello", "answer to hello")
    term.send("work\r")
    term.expect(r"Allow Bash\? \[y/n/a/s\] ")
    term.send("y\r")
    term.expect("Provider returned error")
    term.expect(PROMPT)
    assert any(is_summary(b) for b in server.bodies)
    term.send("after\r")
    assert "answer to after" in term.expect("answer to after|without tool_result blocks")
    term.expect(PROMPT)
    term.send("\x04")
    assert term.wait() == 0


# --- The Read short-cut ---------------------------------------------------------------------------


@pytest.fixture
def notes(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("alpha\nbeta\n")
    os.utime(path, (1_000_000_000, 1_000_000_000))  # long ago: any change now gives it another time
    return path


@pytest.fixture
def reads_ctx(tmp_path) -> agent.ToolContext:
    return agent.ToolContext(cwd=tmp_path, env=agent.command_env(dict(os.environ)), reads={})


def test_a_second_read_of_the_same_lines_is_a_short_note(reads_ctx, notes):
    assert agent.tool_read(reads_ctx, "notes.txt") == "alpha\nbeta\n"
    assert agent.tool_read(reads_ctx, "notes.txt") == NOTE.format("notes.txt")
    assert agent.tool_read(reads_ctx, str(notes)) == NOTE.format(notes)  # the same file by another name
    assert agent.tool_read(reads_ctx, "notes.txt", offset=2) == "beta\n"  # other lines: in full
    assert agent.tool_read(reads_ctx, "notes.txt", offset=2) == NOTE.format("notes.txt")
    plain = reads_ctx._replace(reads=None)  # no conversation to point at: always in full
    assert agent.tool_read(plain, "notes.txt") == agent.tool_read(plain, "notes.txt") == "alpha\nbeta\n"


@pytest.mark.parametrize("change, now", [
    (lambda ctx: agent.tool_write(ctx, "notes.txt", "written\n"), "written\n"),
    (lambda ctx: agent.tool_edit(ctx, "notes.txt", "beta", "gamma"), "alpha\ngamma\n"),
    (lambda ctx: agent.tool_bash(ctx, "touch notes.txt"), "alpha\nbeta\n"),
    (lambda ctx: agent.tool_bash(ctx, "echo more >> notes.txt"), "alpha\nbeta\nmore\n"),
    (lambda ctx: agent.tool_bash(ctx, "printf 'alpha\\nBETA\\n' > n.tmp && mv n.tmp notes.txt"), "alpha\nBETA\n"),
], ids=["Write", "Edit", "touch", "append", "replaced"])
def test_a_read_after_a_change_is_a_full_one(reads_ctx, notes, change, now):
    agent.tool_read(reads_ctx, "notes.txt")
    change(reads_ctx)
    assert agent.tool_read(reads_ctx, "notes.txt") == now


@pytest.mark.parametrize("change", [
    lambda ctx: agent.tool_write(ctx, "notes.txt", "ALPHA\nbeta\n"),
    lambda ctx: agent.tool_edit(ctx, "notes.txt", "alpha", "ALPHA"),
], ids=["Write", "Edit"])
def test_write_and_edit_forget_the_read_even_when_the_file_looks_the_same(reads_ctx, notes, tmp_path, change):
    os.link(notes, tmp_path / "link.txt")  # a hard link: the change is made in place, the inode kept
    agent.tool_read(reads_ctx, "notes.txt")
    before = notes.stat()
    change(reads_ctx)
    os.utime(notes, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (notes.stat().st_size, notes.stat().st_ino) == (before.st_size, before.st_ino)  # the same stamp
    assert agent.tool_read(reads_ctx, "notes.txt") == "ALPHA\nbeta\n"


def test_forget_reads_drops_only_that_file(reads_ctx, tmp_path):
    a, b = str((tmp_path / "a").resolve()), str((tmp_path / "b").resolve())
    reads_ctx.reads.update({(a, 1, 2000): (1, 2, 3), (a, 5, 10): (1, 2, 3), (b, 1, 2000): (4, 5, 6)})
    agent.forget_reads(reads_ctx, tmp_path / "a")
    assert reads_ctx.reads == {(b, 1, 2000): (4, 5, 6)}


@pytest.mark.parametrize("change", [lambda c: c.__delitem__(slice(2, None)),
                                    lambda c: c.__setitem__(1, {"role": "user", "content": "shrunk"})],
                         ids=["dropped", "replaced"])
def test_a_conversation_forgets_its_reads_when_messages_go(change):
    conversation = agent.Conversation([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                       {"role": "assistant", "content": "a"}])
    conversation.reads[("/x", 1, 2000)] = (1, 2, 3)
    change(conversation)
    assert conversation.reads == {}


def test_a_read_after_a_compaction_removed_the_result_is_a_full_one(tmp_path):
    big = "".join(f"line {n:05} " + "b" * 88 + "\n" for n in range(240))  # more than a quarter of the window
    (tmp_path / "big.txt").write_text(big)

    def answer(body):
        if is_summary(body):
            return reply(SUMMARY)
        if not tool_contents(body):
            tokens = 1_000 if compacted(body) else 17_000
            return reply(tool_calls=[call("Read", {"file_path": "big.txt"})], usage=usage(tokens))
        return reply("done")
    model = recorded(answer)
    messages = agent.Conversation([{"role": "system", "content": "s"}, {"role": "user", "content": "read it"}])
    outcome = loop(tmp_path, model, messages, [], context_window=20_000)
    assert outcome.answer == "done" and [is_summary(b) for b in model.sent] == [False, True, False, False]
    assert tool_contents(model.sent[2]) == [] and tool_contents(model.sent[3]) == [big]


def test_the_read_short_cut_end_to_end(serve, run, workspace):
    notes = workspace / "notes.txt"
    notes.write_text("alpha\nbeta\n")
    os.utime(notes, (1_000_000_000, 1_000_000_000))
    steps = [("Read", {}), ("Read", {}), ("Bash", {"command": "touch notes.txt"}), ("Read", {}),
             ("Bash", {"command": "echo more >> notes.txt"}), ("Read", {}),
             ("Write", {"content": "written\n"}), ("Read", {}),
             ("Edit", {"old_string": "written", "new_string": "edited"}), ("Read", {}), ("Read", {})]

    def model(body):
        done = len(tool_contents(body))
        if done == len(steps):
            return reply("done")
        name, args = steps[done]
        return reply(tool_calls=[call(name, args if name == "Bash" else {"file_path": "notes.txt", **args})])
    server = serve(model)
    result = run(["-p", "read notes.txt"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n")
    reads = [c for (name, _), c in zip(steps, tool_contents(server.bodies[-1])) if name == "Read"]
    assert reads == ["alpha\nbeta\n", NOTE.format("notes.txt"), "alpha\nbeta\n", "alpha\nbeta\nmore\n",
                     "written\n", "edited\n", NOTE.format("notes.txt")]


def test_a_forked_skill_reads_in_full_what_the_main_conversation_read(serve, run, workspace):
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    skill = workspace / ".claude" / "skills" / "audit"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: audit\ndescription: Audit in a fork\ncontext: fork\n---\nFORK-BODY\n")

    def model(body):
        messages = body["messages"]
        if "FORK-BODY" in str(messages[1]["content"]):  # the sub-agent reads once, answers with what it got
            if messages[-1]["role"] == "user":
                return reply(tool_calls=[call("Read", {"file_path": "notes.txt"})])
            return reply("SUB: " + messages[-1]["content"])
        done = len(tool_contents(body))
        script = [call("Read", {"file_path": "notes.txt"}), call("Skill", {"name": "audit"}),
                  call("Read", {"file_path": "notes.txt"})]
        return reply(tool_calls=[script[done]]) if done < len(script) else reply("done")
    server = serve(model)
    result = run(["-p", "audit it"], cwd=workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "done\n")
    assert tool_contents(server.bodies[-1]) == ["alpha\nbeta\n", "SUB: alpha\nbeta", NOTE.format("notes.txt")]


def test_a_project_cannot_import_secret_files_from_outside(tmp_path):
    """Outside its repository, a project's CLAUDE.md may import only Markdown and text files, even once approved."""
    files(tmp_path, {"home/.ssh/id_rsa": "PRIVATE-KEY", "home/notes.md": "MY-NOTES", "repo/.git/": "",
                     "repo/docs/key.pem": "IN-REPO-PEM"})
    text = "@~/.ssh/id_rsa @~/notes.md @docs/key.pem"
    expanded = agent.expand_imports(text, tmp_path / "repo", tmp_path / "home", (), tmp_path / "repo",
                                    outside=lambda path: True)
    assert expanded == (f"[@~/.ssh/id_rsa: not imported, only Markdown or text files are taken from outside "
                        f"{tmp_path / 'repo'}] MY-NOTES IN-REPO-PEM")
