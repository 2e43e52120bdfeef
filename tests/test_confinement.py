"""Confinement that holds (issue 20, items 1-3, 7, 8): the attacks that escaped the last round's sandbox, each
re-run against the real kernel. Commands are confined between fork and exec, in their own namespaces, with no
capabilities, a seccomp filter on sockets and on the calls that reach other processes, and no terminal; solo is
not dumpable, ends what commands leave behind, and blanks every secret in its own environment.

The in-process tests run commands through a confined ToolContext (the pytest process stands in for solo); the
end-to-end ones run ./your_program.sh, and some again as an ordinary user (nobody) when the tests run as root.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from app import main as agent
from tests.conftest import PROGRAM, PROMPT
from tests.fake_openrouter import call, reply
from tests.test_sandbox import confined, outside, private_tmp, real, script  # noqa: F401 (fixtures)

MACHINE = os.uname().machine


def python(code: str) -> str:
    """A command that runs Python code (single quotes kept out of it)."""
    assert "'" not in code
    return f"python3 -c '{code}'"


def fails(result: str) -> bool:
    """A command result that ended in an error the kernel gave."""
    return bool(re.search(r"Operation not permitted|Permission denied|No such process", result)) and \
        "[exit code 0]" not in result


# --- 1. Nothing confined shares memory with solo ------------------------------------------------------


def test_the_agent_has_no_confined_thread():
    """No thread of this process is under a seccomp filter or no_new_privs after a sandbox is made."""
    sandbox, _ = agent.make_sandbox("workspace-write", (Path(real(Path.cwd())),), False)
    try:
        for task in Path("/proc/self/task").iterdir():
            status = (task / "status").read_text()
            assert "NoNewPrivs:\t0" in status and "Seccomp:\t0" in status, status
    finally:
        sandbox.spawner.shutdown()


PTRACE = ("import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); pid = int(sys.argv[1]); "
          "tasks = os.listdir(f\"/proc/{pid}/task\") if os.path.exists(f\"/proc/{pid}/task\") else [str(pid)]; "
          "print([(t, libc.ptrace(16, int(t), 0, 0), ctypes.get_errno()) for t in tasks])")  # PTRACE_ATTACH


def test_a_confined_command_cannot_attach_to_any_thread_of_the_agent(confined):
    result = agent.tool_bash(confined, python(PTRACE) + f" {os.getpid()}")
    attached = [int(t) for t, code, _ in eval(result.split("\n")[0])] if result.startswith("[") else []
    assert "[exit code 0]" in result and all(code == -1 for _, code, _ in eval(result.split("\n")[0])), result
    assert attached  # the attempt was really made
    assert "TracerPid:\t0" in Path("/proc/self/status").read_text()


def test_a_confined_command_cannot_read_the_agents_memory_or_environment(confined):
    pid = os.getpid()
    command = f"cat /proc/{pid}/environ /proc/{pid}/task/*/mem /proc/{pid}/mem 2>&1 | head -c 300"
    result = agent.tool_bash(confined, command)
    assert "No such file" in result and "OPENROUTER" not in result and "PATH=" not in result, result


def test_process_vm_readv_and_keyctl_and_bpf_are_refused(confined):
    code = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); nr = %s; "
            "print([(n, libc.syscall(nr[n], 0, 0, 0, 0, 0), ctypes.get_errno()) for n in nr])")
    numbers = {name: agent.SYSCALLS[name][MACHINE == "aarch64"] for name in
               ("process_vm_readv", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "unshare",
                "setns", "mount", "open_by_handle_at")}
    result = agent.tool_bash(confined, python(code % json.dumps(numbers)))
    answers = eval(result.split("\n")[0])
    assert answers and all(code == -1 and err == 1 for _, code, err in answers), result  # EPERM, from the filter


def test_the_syscall_numbers_are_the_kernels():
    header = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
              "aarch64": "/usr/include/asm-generic/unistd.h"}.get(MACHINE, "")
    if not os.path.exists(header):
        pytest.skip(f"no kernel headers for {MACHINE} on this machine")
    defined = dict(re.findall(r"#define __NR_?(\w+)\s+(\d+)", Path(header).read_text()))
    ours = {name: numbers[MACHINE == "aarch64"] for name, numbers in agent.SYSCALLS.items()}
    checked = [name for name, number in ours.items() if number and name in defined]  # headers may be older
    assert len(checked) >= len(ours) - 3 and "fchmodat2" in ours
    for name in checked:
        assert int(defined[name]) == ours[name], name
    assert not any(name in defined for name, number in ours.items() if number is None)


# --- 2. Network off means no socket but socketpair ----------------------------------------------------


SOCKETS = {  # name: Python that opens (and where it can, uses) such a socket; prints "opened" when it could
    "tcp": "s = socket.create_connection((\"127.0.0.1\", {tcp}), 2); print(\"opened\")",
    "mptcp": "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); s.connect((\"127.0.0.1\", {tcp})); "
             "print(\"opened\")",
    "udp": "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b\"secret\", (\"127.0.0.1\", {udp})); "
           "print(\"opened\")",
    "udp6": "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); print(\"opened\")",
    "icmp": "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print(\"opened\")",
    "ping": "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); print(\"opened\")",
    "packet": "s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print(\"opened\")",
    "netlink": "s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print(\"opened\")",
    "unix": "s = socket.socket(socket.AF_UNIX); s.connect(\"{unix}\"); print(\"opened\")",
    "socketpair": "a, b = socket.socketpair(); print(\"opened\")",
    "io_uring": "import ctypes; libc = ctypes.CDLL(None, use_errno=True); p = ctypes.create_string_buffer(120); "
                "fd = libc.syscall(425, 4, p); print(\"opened\" if fd >= 0 else ctypes.get_errno())",
}


@pytest.fixture
def listeners(tmp_path):
    """A TCP, a UDP and a pathname unix listener on this machine, outside the sandbox."""
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    path = str(tmp_path / "daemon.sock")
    unix.bind(path)
    unix.listen()
    for s in (tcp, udp, unix):
        s.setblocking(False)
    yield {"tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1], "unix": path, "sockets": (tcp, udp, unix)}
    for s in (tcp, udp, unix):
        s.close()


def reached(sockets) -> list[str]:
    """Which of the listeners got a connection or a datagram."""
    got = []
    for name, s in zip(("tcp", "udp", "unix"), sockets):
        try:
            s.recv(100) if name == "udp" else s.accept()
            got.append(name)
        except BlockingIOError:
            pass
    return got


@pytest.mark.parametrize("network, unix, allowed", [
    (False, False, {"socketpair"}),
    (True, False, {"socketpair", "tcp", "udp", "udp6"}),
    (False, True, {"socketpair", "unix"}),
])
def test_only_the_socket_kinds_allowed_can_be_opened(workspace, private_tmp, listeners, network, unix, allowed):
    roots = (Path(real(workspace)), Path(real(private_tmp)))
    sandbox, _ = agent.make_sandbox("workspace-write", roots, network, unix)
    ctx = agent.ToolContext(cwd=workspace, env=agent.command_env(dict(os.environ)), sandbox=sandbox)
    try:
        opened = set()
        for name, code in SOCKETS.items():
            result = agent.tool_bash(ctx, python("import socket; " + code.format(**listeners)))
            if result.startswith("opened"):
                opened.add(name)
            else:
                assert "Error" in result or "\n1\n" in result or result.startswith(("1\n", "Traceback")), result
        assert opened == allowed
        assert set(reached(listeners["sockets"])) == allowed & {"tcp", "udp", "unix"}
    finally:
        sandbox.spawner.shutdown()


def test_a_daemon_behind_a_unix_socket_cannot_be_asked_to_run_a_command(confined, tmp_path):
    """tmux's server runs what a client asks, unconfined: with unix sockets off it cannot be reached."""
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed")
    sock, marker = tmp_path / "tmux.sock", tmp_path / "escaped"
    subprocess.run(["tmux", "-S", str(sock), "new-session", "-d", "sleep 30"], check=True)
    try:
        result = agent.tool_bash(confined, f"tmux -S {sock} run-shell 'touch {marker}'")
        assert "[exit code 0]" not in result and not marker.exists(), result
    finally:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], check=False)


DATAGRAM_PAIRS = {  # issue 29: a datagram socketpair's socket reached a pathname socket outside (/dev/log, journald)
    "sendto": "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b\"forged\", \"{path}\")",
    "connect": "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK); "
               "a.connect(\"{path}\"); a.send(b\"forged\")",
    "sendmsg": "a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC); "
               "a.sendmsg([b\"forged\"], [], 0, \"{path}\")",
    "raw call": "import ctypes; libc = ctypes.CDLL(None, use_errno=True); fds = (ctypes.c_int * 2)(); "
                "print(libc.socketpair(1, 2 | 0x80800, 0, fds), ctypes.get_errno()); "
                "a = socket.socket(fileno=fds[0]); a.sendto(b\"forged\", \"{path}\")",
}


@pytest.fixture
def log_socket(tmp_path):
    """A pathname unix datagram socket outside the sandbox, as /dev/log is."""
    path = tmp_path / "log.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield sock, path
    sock.close()


@pytest.mark.parametrize("attack", DATAGRAM_PAIRS)
def test_a_datagram_socketpair_cannot_reach_a_socket_outside(confined, log_socket, attack):
    sock, path = log_socket
    result = agent.tool_bash(confined, python("import socket; " + DATAGRAM_PAIRS[attack].format(path=path) +
                                              "; print(\"sent\")"))
    assert "sent" not in result and ("not permitted" in result or "-1 1" in result), result
    with pytest.raises(BlockingIOError):
        sock.recv(100)


def test_connected_socketpairs_still_work_and_unix_sockets_on_allows_datagram_pairs(workspace, private_tmp,
                                                                                    log_socket):
    pairs = ("import socket; [socket.socketpair(socket.AF_UNIX, kind | flags) for kind in (socket.SOCK_STREAM, "
             "socket.SOCK_SEQPACKET) for flags in (0, socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)]; print(\"pairs\")")
    sock, path = log_socket
    for unix in (False, True):
        roots = (Path(real(workspace)), Path(real(private_tmp)))
        sandbox, _ = agent.make_sandbox("workspace-write", roots, False, unix)
        ctx = agent.ToolContext(cwd=workspace, env=agent.command_env(dict(os.environ)), sandbox=sandbox)
        try:
            assert agent.tool_bash(ctx, python(pairs)).startswith("pairs"), unix
            sent = agent.tool_bash(ctx, python("import socket; " + DATAGRAM_PAIRS["sendto"].format(path=path)))
            assert ("[exit code 0]" in sent) == unix, sent
            named = ("import socket; a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
                     f"a.sendmsg([b\"seqpacket\"], [], 0, \"{path}\"); print(b.recv(100))")
            assert agent.tool_bash(ctx, python(named)).startswith("b'seqpacket'")  # a name is ignored: the peer
        finally:
            sandbox.spawner.shutdown()
    assert sock.recv(100) == b"forged"  # only with unix sockets on
    with pytest.raises(BlockingIOError):
        sock.recv(100)  # and nothing else ever reached it


SCHEDULING = {  # issue 29: a command changed the zygote's (pid 1) scheduling: SCHED_IDLE behind a CPU hog stalled all
    "setpriority": "os.setpriority(os.PRIO_PROCESS, {pid}, 19)",
    "setpriority user": "os.setpriority(os.PRIO_USER, 0, 19)",
    "setpriority group": "os.setpriority(os.PRIO_PGRP, 0, 19)",
    "sched_setscheduler": "os.sched_setscheduler({pid}, os.SCHED_IDLE, os.sched_param(0))",
    "sched_setparam": "os.sched_setparam({pid}, os.sched_param(0))",
    "sched_setaffinity": "os.sched_setaffinity({pid}, {{0}})",
    "sched_setattr": "import ctypes; libc = ctypes.CDLL(None, use_errno=True); attr = (ctypes.c_uint32 * 14)(56, 5); "
                     "assert libc.syscall({setattr}, {pid}, attr, 0) == 0, ctypes.get_errno()",
    "ioprio_set": "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
                  "assert libc.syscall({ioprio}, 1, {pid}, (3 << 13)) == 0, ctypes.get_errno()",  # IOPRIO_CLASS_IDLE
}


@pytest.mark.parametrize("call_", SCHEDULING)
def test_a_command_cannot_change_the_zygotes_scheduling_only_its_own(confined, call_):
    numbers = {"setattr": agent.SYSCALLS["sched_setattr"][MACHINE == "aarch64"],
               "ioprio": agent.SYSCALLS["ioprio_set"][MACHINE == "aarch64"]}
    code = "import os; " + SCHEDULING[call_]
    other = agent.tool_bash(confined, python(code.format(pid=1, **numbers) + "; print(\"changed\")"))
    assert "changed" not in other and ("not permitted" in other or "AssertionError: 1" in other), other
    if "0, 19" not in SCHEDULING[call_]:  # the same call on itself (pid 0) still works
        own = agent.tool_bash(confined, python(code.format(pid=0, **numbers) + "; print(\"changed\")"))
        assert own.startswith("changed"), own
    status = Path(f"/proc/{confined.sandbox.zygote.pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert (status[16], status[38]) == (str(os.getpriority(os.PRIO_PROCESS, 0)), "0"), status  # nice, policy


@pytest.mark.parametrize("command, works", [
    ("renice -n 10 -p 1", False), ("chrt -i -p 0 1", False), ("taskset -p 1 1", False), ("ionice -c 3 -p 1", False),
    ("nice -n 5 sh -c 'cut -d\" \" -f19 /proc/self/stat'", True), ("chrt -i 0 true", True),
    ("taskset 1 true", True), ("ionice -c 3 true", True),
])
def test_renice_chrt_taskset_on_the_zygote_fail_and_on_a_new_command_work(confined, command, works):
    if not shutil.which(command.split()[0]):
        pytest.skip(f"{command.split()[0]} is not installed")
    result = agent.tool_bash(confined, command)
    assert "[exit code 0]" in result if works else fails(result), result


# --- 3. No capabilities, no terminal, no devices ---------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="a root command's capabilities are what this takes away")
@pytest.mark.parametrize("command", [
    "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | grep -v '0000000000000000' && exit 1 || exit 0",
    "! hostname solo-was-here",
    "! ip addr add 192.0.2.7/32 dev lo 2>&1",
    "! mknod disk b 7 0",
    "! mknod char c 1 3",
    "! " + python("import time; time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME))"),
    python("import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")") + " 2>&1 | grep -q 'not permitted'",
    python("import fcntl; fcntl.ioctl(0, 0x541C, b\"x\")") + " 2>&1 | grep -q 'not permitted'",
    "! echo typed > /dev/tty",
    "! unshare -U true",
    "! mount -t tmpfs none /mnt",
])
def test_root_inside_the_sandbox_has_no_power(confined, command):
    hostname = socket.gethostname()
    result = agent.tool_bash(confined, command)
    assert result.endswith("[exit code 0]") or "[exit code 0]\n" in result, result
    assert socket.gethostname() == hostname
    assert not (confined.cwd / "disk").exists() and not (confined.cwd / "char").exists()


def test_a_confined_command_cannot_open_a_terminal_of_the_user(confined):
    master, slave = os.openpty()
    try:
        path = os.ttyname(slave)
        result = agent.tool_bash(confined, f"echo typed > {path}; cat {path}; exec 3<>/dev/ptmx")
        assert result.count("Permission denied") == 3, result
        os.set_blocking(master, False)
        with pytest.raises(BlockingIOError):
            os.read(master, 100)  # nothing was typed
    finally:
        os.close(master)
        os.close(slave)


def test_confined_commands_run_in_a_new_session_with_no_terminal(confined):
    result = agent.tool_bash(confined, "ps -o sid=,tty= -p $$; test -t 0 || test -t 1 || echo no-tty")
    assert "no-tty" in result and "?" in result, result


# --- 7. Nothing a command starts outlives the agent ---------------------------------------------------


def lingering(marker: str) -> str:
    """A command that runs for 5 minutes with the marker in its command line: one process (a child would outlive it
    unmarked, and so outlive the test)."""
    return f"bash -c 'exec -a {marker} sleep 300'"


def pids_with(marker: str) -> list[int]:
    """Processes whose command line holds the marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def wait_until_gone(marker: str, seconds: float = 5) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := pids_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("flags", [[], ["--sandbox", "workspace-write"]])
def test_background_setsid_and_nohup_children_end_when_the_agent_does(serve, run, workspace, private_tmp, flags):
    marker = f"solo-leftover-{os.getpid()}-{len(flags)}"
    commands = [f"{lingering(marker)} > /dev/null 2>&1 &", f"nohup {lingering(marker)} > /dev/null 2>&1 &",
                f"setsid {lingering(marker)} > /dev/null 2>&1 < /dev/null &",
                f"(setsid sh -c \"{lingering(marker)} &\" &) > /dev/null 2>&1"]
    server = serve(script([call("Bash", {"command": c}, id=f"c{i}") for i, c in enumerate(commands)]))
    result = run(["-p", "go", *flags], cwd=workspace, base_url=server.url, env={"TMPDIR": str(private_tmp)})
    assert result.code == 0, result.stderr
    assert wait_until_gone(marker) == []


@pytest.mark.parametrize("flags", [[], ["--sandbox", "workspace-write"]])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_what_commands_left_running_ends_when_the_agent_is_stopped(serve, workspace, tmp_path, signum, flags):
    marker = f"solo-stopped-{os.getpid()}-{signum}-{len(flags)}"
    steps = [[call("Bash", {"command": f"setsid {lingering(marker)} > /dev/null 2>&1 < /dev/null &"}, id="a")],
             [call("Bash", {"command": lingering(marker + "-running")}, id="b")]]
    server = serve(script(*steps))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    env.update(OPENROUTER_BASE_URL=server.url, OPENROUTER_API_KEY="k", HOME=str(tmp_path))
    proc = subprocess.Popen([str(PROGRAM), "-p", "go", *flags], cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while len(pids_with(marker)) < 2:  # the leftover and the running command
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signum)
    assert proc.wait(15) == 128 + signum, proc.stderr.read()
    assert wait_until_gone(marker) == []


@pytest.mark.parametrize("flags", [[], ["--sandbox", "workspace-write"]])
def test_a_running_command_and_a_confined_background_job_die_with_a_killed_agent(serve, workspace, tmp_path,
                                                                                   private_tmp, flags):
    """SIGKILL leaves solo no time: what it started itself dies with it, and so does a command's leftover job (a
    confined one's in the namespace, whose init dies with solo; an unconfined one's with the zygote, which kills it)."""
    marker = f"solo-orphan-{os.getpid()}-{len(flags)}"
    steps = [[call("Bash", {"command": f"{lingering(marker + '-left')} > /dev/null 2>&1 &"}, id="a")],
             [call("Bash", {"command": lingering(marker + "-running")}, id="b")]]
    server = serve(script(*steps))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    env.update(OPENROUTER_BASE_URL=server.url, OPENROUTER_API_KEY="k", HOME=str(tmp_path), TMPDIR=str(private_tmp))
    proc = subprocess.Popen([str(PROGRAM), "-p", "go", *flags], cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (pids_with(marker + "-left") and pids_with(marker + "-running")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    try:
        assert wait_until_gone(marker + "-running", 2) == []
        assert wait_until_gone(marker + "-left", 2) == []
    finally:
        for pid in pids_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_what_shells_hooks_and_sub_agents_commands_start_dies_with_a_killed_agent(serve, workspace, tmp_path):
    """kill -9 of solo ends the children of a background shell (in its group and out of it), of a hook, of a
    sub-agent's command and of an MCP server, all unconfined: nothing with a marker is left 2 s later."""
    marker = f"solo-killed-{os.getpid()}"
    left = lambda name: f"{lingering(f'{marker}-{name}')} > /dev/null 2>&1"
    shell = f"{left('grouped')} & setsid {left('session')} & {lingering(marker + '-shell')}"
    asked = threading.Event()

    def model(body: dict) -> dict:
        task, done = body["messages"][1]["content"], sum(m["role"] == "assistant" for m in body["messages"])
        if task == "sub":
            return reply(tool_calls=[call("Bash", {"command": f"{left('sub')} &"})]) if done == 0 else reply("ok")
        if done == 0:
            return reply(tool_calls=[call("Bash", {"command": shell, "run_in_background": True}, id="bg"),
                                     call("Agent", {"description": "d", "prompt": "sub"}, id="ag")])
        asked.set()
        time.sleep(30)  # solo waits for this reply when it is killed
        return reply("late")

    server = serve(model)
    hook = {"type": "command", "command": f"{left('hook')} & exit 0"}
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"PreToolUse": [{"hooks": [hook]}]}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
    env.update(OPENROUTER_BASE_URL=server.url, OPENROUTER_API_KEY="k", HOME=str(tmp_path))
    server_file = Path(__file__).resolve().with_name("mcp_server.py")
    mcp = {"command": "sh", "args": ["-c", f"setsid {left('mcp')} & exec {sys.executable} {server_file}"]}
    proc = subprocess.Popen([str(PROGRAM), "-p", "go", "--permission-mode", "bypassPermissions", "--mcp-config",
                             json.dumps({"mcpServers": {"s": mcp}})], cwd=workspace, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    names = ("grouped", "session", "shell", "sub", "hook", "mcp")
    try:
        assert asked.wait(30)
        deadline = time.monotonic() + 10
        while not all(pids_with(f"{marker}-{name}") for name in names):
            assert time.monotonic() < deadline, [name for name in names if not pids_with(f"{marker}-{name}")]
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        assert wait_until_gone(marker, 2) == []
    finally:
        for pid in pids_with(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("flags", [[], ["--sandbox", "workspace-write"]])
def test_a_session_lists_what_earlier_commands_left_running_before_asking(serve, terminal, workspace, flags):
    marker = f"solo-typist-{os.getpid()}-{len(flags)}"
    steps = [[call("Bash", {"command": f"{lingering(marker)} > /dev/null 2>&1 &"}, id="a")],
             [call("Bash", {"command": "git status"}, id="b")]]
    server = serve(script(*steps))
    session = terminal(server, *flags)
    session.send("go\r")
    session.expect(r"Allow Bash\? \[y/n/a/s\] ")
    session.send("y\r")
    screen = session.expect(r"Allow Bash\? \[y/n/a/s\] ")
    assert "still running from earlier commands" in screen and marker in screen, screen
    assert screen.index(marker) < screen.index("Bash wants to run:\r\ngit status")  # listed before the question
    session.send("n\r")
    session.expect(PROMPT)
    session.send("/exit\r")
    assert session.wait() == 0
    assert wait_until_gone(marker) == []


# --- The zygote: commands fork from one small confined process -----------------------------------------


def test_commands_cannot_stop_the_zygote_they_start_from(confined):
    """Every command of a sandbox is a child of one confined process, the init of their namespace: a command that
    kills everything it can, or signals the init, ends nothing that later commands need."""
    zygote = confined.sandbox.zygote
    pid = zygote.pid
    first = agent.tool_bash(confined, "echo $PPID; kill -9 -1; kill -KILL 1; kill -STOP 1; kill -INT 1; "
                                      "kill -TERM 1; pkill -9 -f [z]ygote; echo sent")
    assert first.startswith("1\n") and "sent\n" in first, first
    assert agent.tool_bash(confined, "echo alive") == "alive\n[exit code 0]"
    assert zygote.pid == pid and "State:\tT" not in Path(f"/proc/{pid}/status").read_text()  # nor stopped


PIDFD_GETFD = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); pidfd = libc.syscall(434, 1, 0); "
               "print(pidfd >= 0, libc.syscall(438, pidfd, 3, 0), ctypes.get_errno())")


def test_a_command_cannot_read_the_zygote_or_take_its_socket(confined):
    result = agent.tool_bash(confined, "cat /proc/1/environ /proc/1/mem; readlink /proc/1/fd/0; " + python(PIDFD_GETFD))
    assert result.count("Permission denied") == 2 and "True -1 1" in result, result  # EPERM: it is not dumpable
    assert "/dev/null" not in result


def test_a_command_gets_no_descriptor_of_the_zygote(confined):
    """Only 0, 1 and 2 pass to a command (ls's own listing is 3)."""
    assert agent.tool_bash(confined, "ls /proc/self/fd") == "0\n1\n2\n3\n[exit code 0]"


def test_a_killed_zygote_ends_its_commands_and_the_next_command_starts_a_new_one(confined):
    zygote = confined.sandbox.zygote
    first, running = zygote.pid, {}
    thread = threading.Thread(target=lambda: running.update(result=agent.tool_bash(confined, "sleep 30")))
    thread.start()
    deadline = time.monotonic() + 10
    while not [one for one in zygote.started if one.args[-1] == "sleep 30" and one.returncode is None]:
        assert time.monotonic() < deadline  # started: the zygote said it runs
        time.sleep(0.02)
    os.kill(first, signal.SIGKILL)  # from outside: as a bug, or the kernel's OOM killer, would
    thread.join(10)
    assert running["result"].endswith("[exit code -9]"), running
    zygote.proc.wait(10)
    assert agent.tool_bash(confined, "echo again") == "again\n[exit code 0]" and zygote.pid != first


def test_a_zygote_that_dies_before_it_answers_is_an_error_at_once_not_after_its_wait(confined, monkeypatch):
    """solo holds no copy of the channel's other end: the zygote's death closes it, whatever the timing."""
    zygote, asked, outcome = confined.sandbox.zygote, threading.Event(), {}
    first, ask = zygote.pid, zygote.ask
    monkeypatch.setattr(zygote, "ask", lambda *request: (ask(*request), asked.set()))

    def run():
        try:
            outcome["result"] = agent.tool_bash(confined, "echo never")
        except agent.ToolError as error:
            outcome["error"] = str(error)

    os.kill(first, signal.SIGSTOP)  # it takes no request now: the next one waits in its socket
    thread = threading.Thread(target=run)
    thread.start()
    assert asked.wait(10)
    os.kill(first, signal.SIGKILL)
    thread.join(10)
    assert "the command starter ended" in outcome.get("error", ""), outcome  # not after ZYGOTE_WAIT's 30 s
    zygote.proc.wait(10)
    assert agent.tool_bash(confined, "echo again") == "again\n[exit code 0]" and zygote.pid != first


def free_descriptors(pid: int, count: int) -> int:
    """A soft RLIMIT_NOFILE for a process that leaves it `count` descriptors to open, once it is idle (none open
    for a moment: the zygote closes a command's pidfd just after it sent it)."""
    deadline = time.monotonic() + 10
    while any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith("[pidfd]") for fd in os.listdir(f"/proc/{pid}/fd")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    taken = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    return next(limit for limit in range(1 << 16) if len(set(range(limit)) - taken) == count)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to list the zygote's descriptors (it is not dumpable)")
def test_a_zygote_out_of_descriptors_fails_that_command_and_keeps_running_the_others(confined):
    """A zygote that can take a request's four descriptors but make no pipe of its own (solo, or the commands, used
    up the limit it inherits) says EMFILE for that command; it does not die and take every running command along."""
    import resource
    zygote = confined.sandbox.zygote
    pid, running = zygote.pid, zygote.popen(["sleep", "30"], cwd=confined.cwd, env=confined.env,
                                           start_new_session=True)
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (free_descriptors(pid, 4), hard))
    try:
        with pytest.raises(OSError) as raised:
            zygote.popen(["true"], cwd=confined.cwd, env=confined.env)
        assert raised.value.errno == errno.EMFILE and running.poll() is None and zygote.pid == pid
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert agent.tool_bash(confined, "echo again") == "again\n[exit code 0]" and zygote.pid == pid
    agent.signal_command(running, signal.SIGKILL)
    assert running.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize("fails", ["socketpair", "pipe"])
def test_a_start_that_runs_out_of_descriptors_keeps_none(confined, monkeypatch, fails):
    """A start that fails for want of a descriptor closes what it made: each failure must not take more of them."""
    zygote, real_pipe, real_pair, pipes = confined.sandbox.zygote, os.pipe, socket.socketpair, []
    assert agent.tool_bash(confined, "echo warm") == "warm\n[exit code 0]"  # the zygote runs: no restart below

    def pipe():
        if pipes:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        pipes.append(real_pipe())
        return pipes[-1]

    def pair(family=socket.AF_UNIX, kind=socket.SOCK_STREAM, *rest):
        if kind == socket.SOCK_SEQPACKET:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_pair(family, kind, *rest)

    before = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "pipe", pipe) if fails == "pipe" else monkeypatch.setattr(socket, "socketpair", pair)
    with pytest.raises(OSError, match="Too many open files"):
        zygote.popen(["true"], cwd=confined.cwd, env=confined.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    monkeypatch.undo()
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert agent.tool_bash(confined, "echo again") == "again\n[exit code 0]"


def stopped(pid: int) -> bool:
    """Whether a process is stopped (by a signal)."""
    return "State:\tT" in Path(f"/proc/{pid}/status").read_text()


def test_a_command_that_stops_its_unconfined_zygote_makes_solo_wait_no_longer_than_zygote_wait(tmp_path, monkeypatch):
    """Outside a sandbox a command may stop its parent, the zygote; the zygote then never says how the command
    ended, and solo waited for it without end (a tool call hung until someone sent SIGCONT). Once the command's pidfd
    says it ended, the zygote has ZYGOTE_WAIT to say how."""
    spawner = agent.Spawner()
    zygote, waited = agent.unconfined_zygote(spawner), {}
    try:
        proc = zygote.popen(["sh", "-c", "read go; kill -STOP $PPID"], cwd=tmp_path, stdin=subprocess.PIPE,
                            env=agent.command_env(dict(os.environ)))
        monkeypatch.setattr(agent, "ZYGOTE_WAIT", 1)  # for the waits below, not for a start on a loaded machine
        proc.stdin.write(b"go\n")  # once the zygote said it runs: a zygote stopped before it answers is ended
        proc.stdin.close()
        deadline = time.monotonic() + 10
        while not stopped(zygote.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        thread = threading.Thread(target=lambda: waited.update(code=proc.wait()), daemon=True)
        thread.start()
        thread.join(10)
        assert waited == {"code": -signal.SIGKILL}
        with pytest.raises(OSError, match="did not answer in 1 s"):  # the stopped zygote is ended, then
            zygote.popen(["true"], cwd=tmp_path, env={})
        monkeypatch.undo()
        assert zygote.popen(["true"], cwd=tmp_path, env={}).wait(10) == 0  # a new one starts
    finally:
        with contextlib.suppress(OSError):
            os.kill(zygote.pid, signal.SIGCONT)
        zygote.stop()
        spawner.shutdown()


def test_a_zygote_that_does_not_answer_is_gone_before_the_next_command_asks(unshared, monkeypatch):
    """solo ends a zygote that does not answer in ZYGOTE_WAIT and says the next command starts a new one: it must be
    gone by then, or the next command asks it again (it still looks running) and fails as well."""
    zygote = unshared.sandbox.zygote  # the zygote is solo's child here, not the init behind a waiter
    first = zygote.pid
    os.kill(first, signal.SIGSTOP)  # from outside: no command can
    monkeypatch.setattr(agent, "ZYGOTE_WAIT", 1)  # for this wait, not for the next start on a loaded machine
    with pytest.raises(OSError, match="did not answer in 1 s; it was ended"):
        zygote.popen(["true"], cwd=unshared.cwd, env=unshared.env)
    monkeypatch.undo()
    assert zygote.popen(["true"], cwd=unshared.cwd, env=unshared.env).wait(10) == 0 and zygote.pid != first


def test_a_command_whose_zygote_died_before_it_was_set_to_die_with_it_never_runs(tmp_path, monkeypatch):
    """Outside a namespace (no sandbox, or a kernel without them) nothing kills a command's child when the zygote dies
    before the child asked to die with it: solo says the command did not start, so it must not run after all."""
    marker, spawner = tmp_path / "ran", agent.Spawner()
    zygote, outcome = agent.unconfined_zygote(spawner), {}
    death = "            self.libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the zygote\n"
    assert death in zygote.source
    zygote.source = zygote.source.replace(death, "            os.kill(os.getpid(), signal.SIGSTOP)\n" + death)

    def run():
        try:
            outcome["code"] = zygote.popen(["touch", str(marker)], cwd=tmp_path, env={}).wait(10)
        except OSError as error:
            outcome["error"] = str(error)
    thread = threading.Thread(target=run)
    try:
        thread.start()
        deadline, child = time.monotonic() + 10, None
        while not child:  # the zygote's child, stopped between fork and exec
            assert time.monotonic() < deadline
            child = next((pid for pid, ppid in agent.ZygoteProgram.parents() if ppid == zygote.pid and stopped(pid)),
                         None)
            time.sleep(0.01)
        pidfd = os.pidfd_open(child)
        os.kill(zygote.pid, signal.SIGKILL)
        zygote.proc.wait(10)
        os.kill(child, signal.SIGCONT)
        assert select.select([pidfd], [], [], 10)[0]  # the child ended
        os.close(pidfd)
        thread.join(10)
        assert "the command starter ended" in outcome.get("error", "") and not marker.exists(), outcome
    finally:
        zygote.stop()
        spawner.shutdown()


def test_a_program_that_does_not_exist_is_an_error_as_with_popen(confined):
    with pytest.raises(FileNotFoundError):
        confined.sandbox.zygote.popen(["no-such-program-here"], cwd=confined.cwd, env=confined.env)
    with pytest.raises(FileNotFoundError, match="missing"):  # the folder is named, not the program
        confined.sandbox.zygote.popen(["true"], cwd=confined.cwd / "missing", env=confined.env)
    assert agent.tool_bash(confined, "echo fine") == "fine\n[exit code 0]"


@pytest.mark.parametrize("command", ["echo a\0b", "echo \ud800"])
def test_a_command_that_cannot_be_passed_to_exec_is_an_error_as_with_popen(confined, command):
    """A NUL or a lone surrogate (a model's JSON may hold one) is an error, not a silent exit code 127."""
    with pytest.raises(agent.ToolError, match="Invalid argument"):
        agent.tool_bash(confined, command)


@pytest.fixture
def unshared(workspace, private_tmp):
    """A confined tool context with no namespaces, as solo runs where the kernel refuses them (the zygote is then
    an ordinary process of the user, not the init of a namespace)."""
    roots = (Path(real(workspace)), Path(real(private_tmp)))
    lib = agent.load_libc()
    ruleset, _ = agent.landlock_ruleset(lib, roots, False)
    confinement = agent.Confinement(lib, ruleset, agent.seccomp_filter(MACHINE, False, False), False)
    spawner = agent.Spawner(confinement.enter)
    zygote = agent.Zygote(spawner, functools.partial(confinement.enter, init=True), ruleset)
    zygote.start()
    sandbox = agent.Sandbox("workspace-write", roots, False, spawner, False, zygote)
    yield agent.ToolContext(cwd=workspace, env={**agent.command_env(dict(os.environ)), "TMPDIR": str(private_tmp)},
                            sandbox=sandbox)
    spawner.shutdown()


def test_a_command_cannot_stop_the_zygote_where_there_are_no_namespaces(unshared):
    """Each command gets a Landlock domain of its own, beneath the zygote's: the zygote (and the zygote's other
    children) are outside it, so no signal of a command reaches them, and solo never waits on a stopped zygote."""
    zygote, result = unshared.sandbox.zygote, {}
    thread = threading.Thread(target=lambda: result.update(out=agent.tool_bash(
        unshared, "kill -STOP $PPID; echo $?; sleep 30", timeout=1000)), daemon=True)
    thread.start()
    thread.join(15)
    stopped = "State:\tT" in Path(f"/proc/{zygote.pid}/status").read_text()
    os.kill(zygote.pid, signal.SIGCONT)
    thread.join(10)
    assert not stopped and "timed out after 1000 ms" in result.get("out", ""), result


def test_what_a_command_left_dies_with_solo_where_there_are_no_namespaces(unshared):
    """Without a namespace whose init takes everything down, the zygote, the subreaper of what commands leave, kills
    it all itself once solo is gone (its socket closes, as when solo is killed)."""
    marker = f"solo-unshared-{os.getpid()}"
    try:
        assert agent.tool_bash(unshared, f"setsid {lingering(marker)} > /dev/null 2>&1 < /dev/null &").endswith(
            "[exit code 0]")
        deadline = time.monotonic() + 10
        while not pids_with(marker):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        unshared.sandbox.zygote.asked.close()
        assert wait_until_gone(marker, 2) == []
    finally:
        for pid in pids_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_command_cannot_signal_or_read_another_commands_processes(confined):
    """Commands share the zygote's namespace, not its Landlock domain: what one left running is out of another's
    reach (as when each command had namespaces of its own)."""
    left = agent.tool_bash(confined, "sleep 300 > /dev/null 2>&1 & echo $!").split("\n")[0]
    result = agent.tool_bash(confined, f"kill -STOP {left}; head -c 4 /proc/{left}/environ; "
                                       f"tr '\\0' ' ' < /proc/{left}/cmdline")  # its command line stays visible
    assert "Operation not permitted" in result and "Permission denied" in result and "sleep 300" in result, result


def test_a_command_cannot_lower_the_limits_of_the_zygote(confined):
    """prlimit on another process is refused (no Landlock rule covers it): a command that took the zygote's file
    descriptors away would make every later command wait for it, then fail. Its own limits a command still sets."""
    result = agent.tool_bash(confined, "prlimit --pid $PPID --nofile=5:5 --nproc=0:0; echo refused $?; "
                                       "prlimit --pid $PPID --nofile | tail -1; ulimit -n 64; ulimit -n; "
                                       "prlimit --nofile=32:32 sh -c 'ulimit -n'")
    assert "refused 1" in result and "\n64\n32\n" in result, result
    started = time.monotonic()
    assert agent.tool_bash(confined, "echo fine") == "fine\n[exit code 0]"
    assert time.monotonic() - started < 5


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to steer the number the next process gets")
def test_ending_a_background_shell_never_hits_a_process_that_took_its_number(confined):
    """The zygote reaps a command as soon as it ends, so a number solo knows may be another process's by the time
    solo ends the command's group (a shell whose job left the group keeps writing, so it looks running): ending it
    must not take an outside process with it."""
    ctx = confined._replace(shells=agent.Shells())
    shell_id = ctx.shells.start(agent.starter(ctx), "setsid sh -c 'while :; do echo x; sleep 0.05; done' &",
                                ctx.cwd, ctx.env)
    pid = ctx.shells.get(shell_id).proc.pid
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for _ in range(50):  # other processes of the machine may take the number first
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if victim.pid == pid:
            break
        victim.kill()
        victim.wait()
    else:
        pytest.skip("could not give an outside process the number")
    try:
        ctx.shells.kill(shell_id)
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_a_confined_shell_that_exited_says_so_while_what_it_left_keeps_writing(confined):
    """The state is the shell's own process's (the zygote reports it), not whether its output is still open."""
    ctx = confined._replace(shells=agent.Shells())
    shell = ctx.shells.get(ctx.shells.start(agent.starter(ctx), "(while :; do echo x; sleep 0.02; done) & echo started; "
                                            "exit 4", ctx.cwd, ctx.env))
    deadline, seen = time.monotonic() + 10, ""
    while not seen.endswith("exit code 4"):
        assert time.monotonic() < deadline, seen
        state, text = shell.take()
        seen += text + state
        time.sleep(0.05)
    assert "started" in seen and shell.pumping  # the output goes on: what the shell left still writes to it
    ctx.shells.close()  # and ending the shell ends what it left in its group
    while shell.pumping:
        assert time.monotonic() < deadline + 10
        time.sleep(0.02)


def test_before_linux_6_9_a_command_is_signalled_by_group_only_while_it_runs(confined, monkeypatch):
    """Without PIDFD_SIGNAL_PROCESS_GROUP (EINVAL), the group is signalled by number only while its leader runs
    (its number is then still its own); once the leader ended, nothing is sent."""
    def old_kernel(pidfd, sig, siginfo=None, flags=0):
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(signal, "pidfd_send_signal", old_kernel)
    zygote = confined.sandbox.zygote
    running = zygote.popen(["sleep", "30"], cwd=confined.cwd, env=confined.env, start_new_session=True)
    assert agent.signal_command(running, signal.SIGKILL) and running.wait(10) == -signal.SIGKILL
    ended = zygote.popen(["true"], cwd=confined.cwd, env=confined.env, start_new_session=True)
    ended.wait(10)
    sent = []
    monkeypatch.setattr(agent, "signal_group", lambda pgid, sig: sent.append(pgid) or True)
    assert not agent.signal_command(ended, signal.SIGKILL) and sent == []


def test_the_zygote_program_is_read_once(confined, monkeypatch):
    """A restarted zygote runs the program solo started with, not whatever its source file holds by then (solo may
    be working on its own code, or be upgraded while it runs)."""
    monkeypatch.setattr(agent, "class_source", lambda _: "raise SystemExit(3)\n")
    zygote = confined.sandbox.zygote
    os.kill(zygote.pid, signal.SIGKILL)
    zygote.proc.wait(10)
    assert agent.tool_bash(confined, "echo restarted") == "restarted\n[exit code 0]"


# --- 8. Secrets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, value, secret", [
    ("GITHUB_PAT", "ghp_x", True), ("PATH", "/bin", False), ("NPM_AUTH", "x", True),
    ("GIT_AUTHOR_NAME", "Ada", False), ("MY_PASS", "x", True), ("PGPASSWORD", "x", True),
    ("SLACK_WEBHOOK_URL", "https://hooks.example/x", True), ("AWS_CREDENTIALS", "x", True),
    ("DATABASE_URL", "postgres://user:pw@db.example/app", True), ("HOMEPAGE", "https://example.org/a@b", False),
    ("SSH_AUTH_SOCK", "/tmp/agent.sock", False), ("COMPASS", "north", False), ("API_KEY", "x", True),
    ("PGPASS", "x", True), ("SMTPPASS", "x", True), ("DBPASS", "x", True), ("MYSQLPWD", "x", True),  # issue 29
    ("GITHUB_TOKEN", "x", True), ("NO_PROXY_BYPASS", "x", False), ("OLDPWD", "/tmp", False),
    ("PGPASSFILE", "/home/u/.pgpass", False), ("AWS_SECRET_ACCESS_KEY", "x", True),
])
def test_the_secret_filter(name, value, secret):
    assert agent.is_secret(name, value) is secret
    assert (name in agent.command_env({name: value})) is not secret


def test_the_agents_own_environment_holds_no_secret(serve, run, workspace):
    """A command reads /proc/<solo>/environ (its parent's parent's, the zygote's, unconfined; root could read it even
    non-dumpable)."""
    server = serve(script([call("Bash", {"command": "tr '\\0' '\\n' < /proc/$(cut -d' ' -f4 /proc/$PPID/stat)/environ"},
                                id="env")]))
    secrets = {"MY_TOKEN": "tok-41a", "DATABASE_URL": "postgres://u:pw-41b@db/app", "GITHUB_PAT": "pat-41c",
               "PGPASS": "pg-41d", "SMTPPASS": "smtp-41e"}  # a suffix too (issue 29)
    result = run(["-p", "go"], cwd=workspace, base_url=server.url, env=secrets)
    assert result.code == 0, result.stderr
    environ = [m["content"] for m in server.bodies[-1]["messages"] if m["role"] == "tool"][0]
    assert "HOME=" in environ  # it was read
    for value in [*secrets.values(), "sk-test-secret-123"]:
        assert value not in environ


def test_a_confined_command_cannot_read_another_processs_environment(confined):
    """The user's shell holds the API key in its environment: in its own PID namespace, a command cannot see it."""
    shell = subprocess.Popen(["sleep", "30"], env={"OPENROUTER_API_KEY": "sk-shell-secret"})
    try:
        result = agent.tool_bash(confined, f"cat /proc/{shell.pid}/environ; ls /proc | grep -c '^[0-9]'")
        assert "sk-shell-secret" not in result and "No such file" in result, result
    finally:
        shell.kill()
        shell.wait()


def test_solo_is_not_dumpable(serve, run, workspace):
    server = serve(script([call("Bash", {"command": "stat -c %U /proc/$PPID/mem; grep -c . /proc/$PPID/status"},
                                id="s")]))
    result = run(["-p", "go"], cwd=workspace, base_url=server.url)
    assert result.code == 0, result.stderr
    assert [m["content"] for m in server.bodies[-1]["messages"] if m["role"] == "tool"][0].startswith("root\n")


# --- As an ordinary user -------------------------------------------------------------------------------


HOSTILE = [
    "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c sk-test-secret-123",
    python("import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM); print(\"udp opened\")"),
    python(PTRACE) + " 1",
    "echo escaped > {outside}/escaped",
    python("import socket; " + DATAGRAM_PAIRS["sendto"].format(path="{outside}/log.sock") + "; print(\"sent\")"),
    "renice -n 10 -p 1; chrt -i -p 0 1; taskset -p 1 1; nice -n 5 echo nice-ran",  # issue 29
    "env | grep -c pg-secret",  # PGPASS: a suffix is secret too (issue 29)
]


RUNTIME = """import json, os, sys, requests
site = [p for p in sys.path if p.endswith("site-packages")]
paths = (getattr(m, "__file__", None) or "" for m in list(sys.modules.values()) if "." not in m.__name__)
print(json.dumps(sorted({os.path.join(s, os.path.relpath(p, s).split(os.sep)[0]) for p in paths for s in site
                         if p.startswith(s + os.sep)})))
"""  # the venv's packages the runtime imports: requests and its own (each a package folder or a module file)


def readable_code(to: Path) -> Path:
    """A copy of app/ and of the venv's runtime packages under `to`, readable by anyone: the checkout and its venv
    may be in a folder nobody can read (a clone under a 0700 temp folder)."""
    shutil.copytree(Path(PROGRAM).parent / "app", to / "app", ignore=shutil.ignore_patterns("__pycache__"))
    (to / "packages").mkdir()
    python = Path(PROGRAM).parent / ".venv" / "bin" / "python"
    for path in map(Path, json.loads(subprocess.run([python, "-c", RUNTIME], capture_output=True, text=True,
                                                    check=True).stdout)):
        if path.is_dir():
            shutil.copytree(path, to / "packages" / path.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, to / "packages" / path.name)
    for path in [to, *to.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return to


def as_nobody(code: Path) -> list[str]:
    """The program's command line for nobody: the system's Python 3.11 (the venv's lives under /root), with the
    readable copy of the code and of the runtime packages on its path."""
    interpreter = shutil.which("python3.11", path="/usr/bin:/usr/local/bin")
    if not interpreter:
        pytest.skip("no Python 3.11 that nobody may run")
    start = "import sys; sys.path[:0] = sys.argv[1:3]; del sys.argv[1:3]; from app.main import cli; cli()"
    return [interpreter, "-P", "-c", start, str(code), str(code / "packages")]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to become nobody")
def test_the_attacks_fail_for_an_ordinary_user_too(serve, tmp_path):
    base = Path(tempfile.mkdtemp(prefix="solo-nobody-", dir="/var/tmp"))  # /tmp/pytest-of-root is root's alone
    (base / "ws").mkdir()
    (base / "outside").mkdir()
    (base / "home").mkdir()
    for path in (base, base / "ws", base / "home"):
        os.chown(path, 65534, 65534)
    os.chmod(base / "outside", 0o777)  # the sandbox, not file permissions, must stop the write
    log = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    log.bind(str(base / "outside" / "log.sock"))
    os.chmod(base / "outside" / "log.sock", 0o777)
    log.setblocking(False)
    try:
        server = serve(script([call("Bash", {"command": c.replace("{outside}", str(base / "outside"))}, id=f"h{i}")
                               for i, c in enumerate(HOSTILE)]))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENROUTER_", "SOLO_"))}
        env.update(OPENROUTER_BASE_URL=server.url, OPENROUTER_API_KEY="sk-test-secret-123", HOME=str(base / "home"),
                   TMPDIR=str(base / "ws"), PGPASS="pg-secret-41")
        nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        proc = subprocess.run([*nobody, *as_nobody(readable_code(base / "code")),
                               "-p", "go", "--sandbox", "workspace-write", "--no-session-persistence"],
                              cwd=base / "ws", env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0 and "namespaces" not in proc.stderr, proc.stderr
        results = [m["content"] for m in server.bodies[-1]["messages"] if m["role"] == "tool"]
        assert results[0].startswith("0\n"), results[0]
        assert "udp opened" not in results[1] and "not permitted" in results[1], results[1]
        assert results[2].startswith("[('1', -1, 1)]"), results[2]  # only its own init to see, and no attaching
        assert "Permission denied" in results[3] and not (base / "outside" / "escaped").exists()
        assert "sent" not in results[4] and "not permitted" in results[4], results[4]
        with pytest.raises(BlockingIOError):
            log.recv(100)
        assert results[5].count("not permitted") == 3 and "nice-ran" in results[5], results[5]
        assert results[6].startswith("0\n"), results[6]
    finally:
        log.close()
        shutil.rmtree(base, ignore_errors=True)
