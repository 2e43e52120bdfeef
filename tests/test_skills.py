"""Skills in Claude Code's .claude/skills format: parsing and substitution tables, then end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import main as agent
from tests.fake_openrouter import call, last_result, reply, tool_then


@pytest.mark.parametrize("text, fields, body", [
    ("---\nname: a\ndescription: does A\n---\nBody\n", {"name": "a", "description": "does A"}, "Body"),
    ('---\nname: "quoted: yes"\ndescription: \'single\'\n---\nB', {"name": "quoted: yes", "description": "single"}, "B"),
    ("---\ndescription: >\n  folded over\n  two lines\ncontext: fork\n---\n\nB\n",
     {"description": "folded over two lines\n", "context": "fork"}, "B"),
    ("\ufeff---\n# comment\nname: x\n---\nB", {"name": "x"}, "B"),
    # README's own example: an inline comment after a plain value is not part of it
    ("---\ncontext: fork            # optional: run as a sub-agent\n---\nB", {"context": "fork"}, "B"),
    ('---\nname: "tab\\there \\"q\\" \\u00e9" # c\ndescription: \'it\'\'s # not a comment\'\n---\nB',
     {"name": 'tab\there "q" \u00e9', "description": "it's # not a comment"}, "B"),
    ("---\ndescription: |-\n  line one\n    indented\n\n  after a gap\nname: a#b\n---\nB",
     {"description": "line one\n  indented\n\nafter a gap", "name": "a#b"}, "B"),
    ("---\ndescription: plain value\n  that goes on\n---\nB", {"description": "plain value that goes on"}, "B"),
])
def test_parse_frontmatter(text, fields, body):
    assert agent.parse_frontmatter(text) == (fields, body)


@pytest.mark.parametrize("text, error", [
    ("", "does not start"),
    ("no frontmatter here", "does not start"),
    ("---\nname: x\nbody without end", "no closing"),
])
def test_parse_frontmatter_errors(text, error):
    with pytest.raises(ValueError, match=error):
        agent.parse_frontmatter(text)


@pytest.mark.parametrize("body, arguments, expected", [
    ("Deploy $ARGUMENTS now", "prod eu", "Deploy prod eu now"),
    ("first=$0 second=$1", "alpha beta", "first=alpha second=beta"),
    ("$1 $0", "x y", "y x"),
    ("a=$ARGUMENTS[0] b=$ARGUMENTS[1] c=$ARGUMENTS[5]", "one two", "a=one b=two c="),
    ("ten=$10 one=$1", " ".join(f"w{i}" for i in range(11)), "ten=w10 one=w1"),
    ("quoted $0|$1", '"two words" last', "quoted two words|last"),
    ("No placeholders.", "extra args", "No placeholders.\n\nARGUMENTS: extra args"),
    ("No placeholders.", "", "No placeholders."),
    ("unbalanced $0", 'it"s', 'unbalanced it"s'),
])
def test_substitute_arguments(body, arguments, expected):
    assert agent.substitute_arguments(body, arguments) == expected


def make_skill(base: Path, folder: str, text: str) -> Path:
    path = base / ".claude" / "skills" / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "SKILL.md").write_text(text)
    return path


def skill_md(name: str, description: str, body: str, extra: str = "") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}\n"


def test_split_invocation():
    skills = {n: agent.Skill(n, "d", "b", Path("/s")) for n in ("a", "b")}
    assert [s.name for s in agent.split_invocation("/a /b rest of it", skills)[0]] == ["a", "b"]
    assert agent.split_invocation("/a /b rest of it", skills)[1] == "rest of it"
    assert agent.split_invocation("/a /zzz rest", skills)[1] == "/zzz rest"
    assert agent.split_invocation("/zzz /a", skills) == ([], "/zzz /a")
    assert agent.split_invocation("/a", skills)[1] == ""


def test_discovery_project_wins_and_broken_files_are_skipped(tmp_path):
    project, home = tmp_path / "project", tmp_path / "home"
    make_skill(project, "shared", skill_md("shared", "project version", "P"))
    make_skill(home, "shared", skill_md("shared", "home version", "H"))
    make_skill(home, "personal", skill_md("personal", "from home", "H2"))
    make_skill(project, "broken", "no frontmatter")
    make_skill(project, "empty", "")
    make_skill(project, "nameless", "---\ndescription: uses the folder name\n---\nbody")
    warnings = []
    skills = agent.discover_skills([project, home], warnings.append)
    assert sorted(skills) == ["nameless", "personal", "shared"]
    assert skills["shared"].description == "project version"
    assert len(warnings) == 3 and all(w.startswith("skipping skill ") for w in warnings[:2])
    assert warnings[2] == f"two skills are called shared: using {project}/.claude/skills/shared, " \
                          f"not {home}/.claude/skills/shared"


# --- End to end -----------------------------------------------------------------------------------


@pytest.fixture
def skills_workspace(workspace):
    make_skill(workspace, "deploy", skill_md("deploy", "Deploy the app to an environment",
                                             "DEPLOY-BODY target=$ARGUMENTS first=$0"))
    make_skill(workspace, "swap", skill_md("swap", "Swap two words", "SWAP-BODY $1 $0"))
    make_skill(workspace, "weather", skill_md("weather", "Answer questions about the weather forecast",
                                              "WEATHER-BODY: always say it will be sunny"))
    make_skill(workspace, "recipes", skill_md("recipes", "Suggest cooking recipes", "RECIPE-BODY: decoy"))
    tool_dir = make_skill(workspace, "greeter", skill_md("greeter", "Greet with the bundled script",
                                                         "Run `bash scripts/hello.sh NAME` and report its output."))
    (tool_dir / "scripts").mkdir()
    (tool_dir / "scripts" / "hello.sh").write_text('echo "hello from the script, $1"\n')
    return workspace


def all_text(body) -> str:
    return "\n".join(str(m.get("content")) for m in body["messages"])


def test_catalog_advertises_every_skill_but_no_body(serve, run, skills_workspace):
    server = serve(lambda body: reply("ok"))
    assert run(["-p", "hi"], cwd=skills_workspace, base_url=server.url).code == 0
    system = server.bodies[0]["messages"][0]["content"]
    for name, description in [("deploy", "Deploy the app to an environment"), ("swap", "Swap two words"),
                              ("weather", "Answer questions about the weather forecast"),
                              ("recipes", "Suggest cooking recipes"), ("greeter", "Greet with the bundled script")]:
        assert f"- {name}: {description}" in system
    assert "BODY" not in all_text(server.bodies[0])
    assert "Skill" in [t["function"]["name"] for t in server.bodies[0]["tools"]]


def test_no_skills_no_catalog_and_no_skill_tool(serve, run, workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "hi"], cwd=workspace, base_url=server.url, env={"HOME": str(workspace)})
    assert "Skill" not in [t["function"]["name"] for t in server.bodies[0]["tools"]]
    assert "Available skills" not in server.bodies[0]["messages"][0]["content"]


def test_slash_invokes_a_skill_with_arguments(serve, run, skills_workspace):
    server = serve(lambda body: reply(body["messages"][-1]["content"]))
    result = run(["-p", "/deploy staging now"], cwd=skills_workspace, base_url=server.url)
    user = server.bodies[0]["messages"][1]["content"]
    assert "DEPLOY-BODY target=staging now first=staging" in user
    assert str(skills_workspace / ".claude" / "skills" / "deploy") in user
    assert "SWAP-BODY" not in user and result.code == 0


def test_positional_arguments_swap(serve, run, skills_workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "/swap left right"], cwd=skills_workspace, base_url=server.url)
    assert "SWAP-BODY right left" in server.bodies[0]["messages"][1]["content"]


def test_stacked_skills_share_the_arguments(serve, run, skills_workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "/deploy /swap a b"], cwd=skills_workspace, base_url=server.url)
    user = server.bodies[0]["messages"][1]["content"]
    assert "DEPLOY-BODY target=a b first=a" in user and "SWAP-BODY b a" in user
    assert user.index("DEPLOY-BODY") < user.index("SWAP-BODY")


def test_unknown_slash_is_an_ordinary_prompt(serve, run, skills_workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "/nonesuch do things"], cwd=skills_workspace, base_url=server.url)
    assert server.bodies[0]["messages"][1]["content"] == "/nonesuch do things"


def test_bundled_script_runs_through_bash(serve, run, skills_workspace):
    def model(body):
        last = body["messages"][-1]
        if last["role"] == "user":
            folder = last["content"].split('folder="')[1].split('"')[0]
            return reply(tool_calls=[call("Bash", {"command": f"cd {folder} && bash scripts/hello.sh Ada"})])
        return reply(last["content"].splitlines()[0])
    server = serve(model)
    result = run(["-p", "/greeter"], cwd=skills_workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "hello from the script, Ada\n")


def test_model_invokes_the_matching_skill_not_the_decoy(serve, run, skills_workspace):
    def model(body):
        last = body["messages"][-1]
        if last["role"] == "user":
            catalog = body["messages"][0]["content"]
            name = next(line.split(":")[0][2:] for line in catalog.splitlines()
                        if line.startswith("- ") and "weather" in line)
            return reply(tool_calls=[call("Skill", {"name": name})])
        return reply("Forecast: sunny" if "always say it will be sunny" in last["content"] else "unknown")
    server = serve(model)
    result = run(["-p", "What's the weather tomorrow?"], cwd=skills_workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "Forecast: sunny\n")
    assert "RECIPE-BODY" not in all_text(server.bodies[1])
    assert "Error" not in server.bodies[1]["messages"][-1]["content"]


def test_skill_tool_errors_for_an_unknown_name(serve, run, skills_workspace):
    server = serve(tool_then([call("Skill", {"name": "nope"})], last_result))
    assert run(["-p", "x"], cwd=skills_workspace, base_url=server.url).stdout.startswith("Error: no skill called nope")


@pytest.fixture
def fork_workspace(workspace):
    make_skill(workspace, "audit", skill_md("audit", "Audit the project in a separate context",
                                            "FORK-BODY: count files matching $ARGUMENTS", "context: fork\n"))
    return workspace


def fork_model(body):
    """A sub-agent answers from its body; the main agent relays what came back."""
    messages = body["messages"]
    if "FORK-BODY" in messages[1]["content"]:
        if messages[-1]["role"] == "user":
            return reply(tool_calls=[call("Bash", {"command": "echo 7"})])
        return reply("SUB-ANSWER " + messages[-1]["content"].splitlines()[0])
    if messages[-1]["role"] == "tool":
        return reply("main got: " + messages[-1]["content"])
    return reply("main: " + messages[-1]["content"].replace("\n", " | "))


def test_fork_by_slash_runs_a_fresh_sub_agent(serve, run, fork_workspace):
    server = serve(fork_model)
    result = run(["-p", "/audit *.py"], cwd=fork_workspace, base_url=server.url)
    assert result.code == 0 and "SUB-ANSWER 7" in result.stdout
    sub = [b for b in server.bodies if "FORK-BODY" in all_text(b)]
    main = [b for b in server.bodies if "FORK-BODY" not in all_text(b)]
    assert len(sub) == 2 and len(main) == 1
    assert [m["role"] for m in sub[0]["messages"]] == ["system", "user"]
    assert "Available skills" not in sub[0]["messages"][0]["content"]
    assert "count files matching *.py" in sub[0]["messages"][1]["content"]
    assert "Skill" not in [t["function"]["name"] for t in sub[0]["tools"]]
    assert "SUB-ANSWER 7" in main[0]["messages"][1]["content"]


def test_fork_by_the_model_returns_only_the_answer(serve, run, fork_workspace):
    def model(body):
        messages = body["messages"]
        if "FORK-BODY" not in messages[1]["content"] and messages[-1]["role"] == "user":
            return reply(tool_calls=[call("Skill", {"name": "audit", "arguments": "*.md"})])
        return fork_model(body)
    server = serve(model)
    result = run(["-p", "Please audit the project"], cwd=fork_workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "main got: SUB-ANSWER 7\n")
    sub = [b for b in server.bodies if "FORK-BODY" in all_text(b)]
    assert sub and all("Please audit the project" not in all_text(b) for b in sub)
    main = [b for b in server.bodies if "FORK-BODY" not in all_text(b)]
    assert len(main) == 2 and main[-1]["messages"][-1]["content"] == "SUB-ANSWER 7"


def test_usage_counts_the_sub_agent(serve, run, fork_workspace):
    import json
    server = serve(fork_model)
    result = run(["-p", "/audit x", "--output-format", "json"], cwd=fork_workspace, base_url=server.url)
    assert json.loads(result.stdout)["usage"]["requests"] == len(server.bodies) == 3


def test_broken_skill_files_warn_and_never_stop_the_run(serve, run, skills_workspace):
    make_skill(skills_workspace, "bad", "---\nname: bad\nno closing line")
    (skills_workspace / ".claude" / "skills" / "binary").mkdir()
    (skills_workspace / ".claude" / "skills" / "binary" / "SKILL.md").write_bytes(b"\xff\xfe\x00bad")
    server = serve(lambda body: reply("still fine"))
    result = run(["-p", "/bad"], cwd=skills_workspace, base_url=server.url)
    assert (result.code, result.stdout) == (0, "still fine\n")
    assert result.stderr.count("solo: skipping skill") == 2
    assert server.bodies[0]["messages"][1]["content"] == "/bad"


def test_home_skills_are_found(serve, run, workspace, tmp_path):
    home = tmp_path / "home"
    make_skill(home, "mine", skill_md("mine", "A personal skill", "MINE-BODY"))
    server = serve(lambda body: reply("ok"))
    run(["-p", "/mine"], cwd=workspace, base_url=server.url, env={"HOME": str(home)})
    assert "- mine: A personal skill" in server.bodies[0]["messages"][0]["content"]
    assert "MINE-BODY" in server.bodies[0]["messages"][1]["content"]


def test_not_offering_the_skill_tool_drops_the_catalog_but_slash_still_works(serve, run, skills_workspace):
    server = serve(lambda body: reply("ok"))
    run(["-p", "/swap a b", "--tools", "Read,Bash"], cwd=skills_workspace, base_url=server.url)  # not offered
    # (--disallowed-tools is a rule now, which refuses a call but offers the tool)
    assert "Available skills" not in server.bodies[0]["messages"][0]["content"]
    assert "SWAP-BODY b a" in server.bodies[0]["messages"][1]["content"]
