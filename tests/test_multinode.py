"""launch-server for a profile that spans two nodes: each node's own command, only node rank 0
serves HTTP, and a missing or misplaced node option is one line naming the fix."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from conftest import REPO
from eagledata.cli import app
from eagledata.errors import ConfigError, LaunchError
from eagledata.profiles.loading import load_profile
from eagledata.profiles.profile import NodeRank
from eagledata.server.launch import build_launch_command

runner = CliRunner()
PROFILES_DIR = REPO / "configs" / "profiles"
HEAD = "10.0.0.1:50000"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("SGLANG_PYTHON", raising=False)


def launch(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["launch-server", *args], env=env)


@pytest.mark.parametrize("rank", [0, 1])
def test_dry_run_prints_that_nodes_command_on_one_line(rank: int) -> None:
    result = launch(
        "--profile", "kimi-k25-h100x16", "--node-rank", str(rank),
        "--dist-init-addr", HEAD, "--sglang-version", "0.5.23", "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    command = lines[0]
    for part in (
        "--tp-size 16",
        "--nnodes 2",
        f"--node-rank {rank}",
        f"--dist-init-addr {HEAD}",
        "--kv-cache-dtype bf16",
    ):
        assert f" {part} " in f" {command} ", part
    assert command.startswith("scripts/launch_sglang.sh --model-path moonshotai/Kimi-K2.5 ")
    err = result.stderr
    if rank == 0:
        assert "node rank 0 of 2: serves the HTTP API once every node has joined" in err
        assert "eagledata generate --server http://10.0.0.1:30000" in err
    else:
        assert (
            "node rank 1 of 2: runs its share of the model's ranks and no HTTP API; eagledata "
            "generate talks to node rank 0 (http://10.0.0.1:30000, the --dist-init-addr host)"
        ) in err


def test_each_node_differs_only_in_its_rank() -> None:
    profile = load_profile("kimi-k25-h100x16", PROFILES_DIR)
    zero = build_launch_command(profile, version="0.5.9", node=NodeRank(0, HEAD))
    one = build_launch_command(profile, version="0.5.9", node=NodeRank(1, HEAD))
    assert [i for i, (a, b) in enumerate(zip(zero, one, strict=True)) if a != b] == [
        zero.index("--node-rank") + 1
    ]
    # the node's place comes after the profile's flags and before host/port (extras last)
    assert zero[-8:] == [
        "--node-rank", "0", "--dist-init-addr", HEAD, "--host", "127.0.0.1", "--port", "30000",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            [],
            "profile kimi-k25-h100x16 spans 2 nodes: pass --node-rank R and --dist-init-addr "
            "HOST:PORT (R from 0 to 1 on each node; HOST:PORT the node-rank-0 node's address, "
            "the same on every node)",
        ),
        (
            ["--node-rank", "1"],
            "profile kimi-k25-h100x16 spans 2 nodes: pass --dist-init-addr HOST:PORT (R from 0 "
            "to 1 on each node; HOST:PORT the node-rank-0 node's address, the same on every node)",
        ),
        (
            ["--node-rank", "2", "--dist-init-addr", HEAD],
            "--node-rank 2: profile kimi-k25-h100x16 spans 2 nodes, so 0 to 1",
        ),
        (
            ["--node-rank", "0", "--dist-init-addr", "10.0.0.1"],
            "--dist-init-addr '10.0.0.1': write HOST:PORT, the node-rank-0 node's address and a "
            "free port (e.g. 10.0.0.1:50000)",
        ),
    ],
    ids=["neither", "no-address", "rank-out-of-range", "no-port"],
)
def test_a_multi_node_profile_without_its_place_is_one_line_naming_it(
    args: list[str], line: str
) -> None:
    result = launch("--profile", "kimi-k25-h100x16", "--dry-run", *args)
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"eagledata: error: {line}"]


def test_node_options_for_a_one_node_profile_are_refused() -> None:
    result = launch("--profile", "kimi-k25-tp8", "--node-rank", "0", "--dry-run")
    assert result.exit_code != 0
    assert result.stderr.splitlines() == [
        "eagledata: error: profile kimi-k25-tp8 runs on one node: drop --node-rank and "
        "--dist-init-addr (they are for a profile with nnodes > 1)"
    ]


@pytest.mark.parametrize(
    "extra", [["--node-rank", "1"], ["--nnodes=2"], ["--dist-init-addr", HEAD]]
)
def test_the_node_flags_cannot_come_in_through_the_extra_arguments(extra: list[str]) -> None:
    profile = load_profile("kimi-k25-h100x16", PROFILES_DIR)
    with pytest.raises(LaunchError, match=r"^refused --(nnodes|node-rank|dist-init-addr) after --"):
        build_launch_command(profile, extra, version="0.5.23", node=NodeRank(0, HEAD))


def test_node_of_a_one_node_profile_is_none_and_of_two_a_place() -> None:
    assert load_profile("kimi-k25-tp8", PROFILES_DIR).node(None, None) is None
    two = load_profile("kimi-k25-h100x16", PROFILES_DIR)
    assert two.node(1, HEAD) == NodeRank(1, HEAD)
    with pytest.raises(ConfigError):
        two.node(None, None)


def test_node_rank_one_starts_its_command_and_waits_without_http(tmp_path: Path) -> None:
    """Rank > 0 has no /health to wait on and nothing to check: launch-server runs its command
    and returns when it ends (node rank 0 is what generate and the guard talk to)."""
    record = tmp_path / "argv"
    fake = tmp_path / "fake-python"
    # the version probe (-c) prints nothing; the launch records its arguments and ends
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\nprintf "%s\\n" "$@" > "{record}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    result = launch(
        "--profile", "kimi-k25-h100x16", "--node-rank", "1", "--dist-init-addr", HEAD,
        "--sglang-version", "0.5.23", "--deadline", "1",
        env={**os.environ, "SGLANG_PYTHON": str(fake)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    argv = record.read_text().splitlines()
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert "no HTTP API" in result.stderr
    assert "health" not in result.stderr


# --- the SLURM script (docs/fleet.md) ---------------------------------------------------------

SLURM_SCRIPT = REPO / "scripts" / "slurm_fleet.sh"
FAKE_SCONTROL = '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "%s\\n" $FAKE_NODES\n'
FAKE_SRUN = '#!/bin/sh\necho "srun $*" >> "$CALLS"\n'
# eagledata: the router's launch-server says it is ready and serves until Ctrl-C (which it
# takes in the background too, as eagledata's CLI does: cli/interrupts.py)
FAKE_EAGLEDATA = f"""#!{sys.executable}
import os, signal, sys, time
with open(os.environ["CALLS"], "a") as calls:
    calls.write(" ".join(["eagledata", *sys.argv[1:]]) + "\\n")
if "--router" in sys.argv:
    def stop(signum, frame):
        with open(os.environ["CALLS"], "a") as calls:
            calls.write("router stopped\\n")
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    print("router ready at http://x:30100 over N workers, each checked", flush=True)
    while True:
        time.sleep(0.05)
"""


def run_slurm_script(tmp_path: Path, nodes: list[str], **env: str) -> tuple[int, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("scontrol", FAKE_SCONTROL),
        ("srun", FAKE_SRUN),
        ("eagledata", FAKE_EAGLEDATA),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    done = subprocess.run(
        ["bash", str(SLURM_SCRIPT)],
        cwd=tmp_path,
        env={
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "CALLS": str(calls),
            "FAKE_NODES": " ".join(nodes),
            "SLURM_JOB_NODELIST": "n[1-4]",
            "SLURM_JOB_ID": "77",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.slow
def test_the_slurm_script_starts_one_server_per_node_the_router_then_one_job(
    tmp_path: Path,
) -> None:
    code, calls = run_slurm_script(tmp_path, ["n1", "n2", "n3"], PROFILE="kimi-k25-b200-dcp8")
    assert code == 0, calls
    host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    servers = sorted(c for c in calls if c.startswith("srun "))  # started side by side
    assert servers == [
        f"srun --nodes=1 --ntasks=1 --nodelist={node} eagledata launch-server --profile "
        "kimi-k25-b200-dcp8 -- --host 0.0.0.0"
        for node in ("n1", "n2", "n3")
    ]
    router = next(c for c in calls if "--router " in c)
    assert router == (
        "eagledata launch-server --router http://n1:30000 --router http://n2:30000 --router "
        "http://n3:30000 --router-host 0.0.0.0 --router-port 30100"
    )
    generate = next(c for c in calls if c.startswith("eagledata generate"))
    assert generate == (
        f"eagledata generate --dataset b2 --server http://{host}:30100 --out runs/77"
    )
    assert calls.index(router) < calls.index(generate)
    assert calls[-1] == "router stopped"  # Ctrl-C to the router's launch-server at the end


@pytest.mark.slow
def test_the_slurm_script_gives_each_node_of_a_two_node_server_its_place(tmp_path: Path) -> None:
    code, calls = run_slurm_script(
        tmp_path, ["n1", "n2", "n3", "n4"], PROFILE="kimi-k25-h100x16", NODES_PER_SERVER="2"
    )
    assert code == 0, calls

    def place(call: str, flag: str) -> str:
        return call.split(f"{flag}")[1].split()[0]

    placed = sorted(
        (place(c, "--nodelist="), place(c, "--node-rank "), place(c, "--dist-init-addr "))
        for c in calls
        if c.startswith("srun ")
    )
    # n1 and n2 make the first server, n3 and n4 the second; each node its rank, one address
    assert placed == [
        ("n1", "0", "n1:50000"),
        ("n2", "1", "n1:50000"),
        ("n3", "0", "n3:50000"),
        ("n4", "1", "n3:50000"),
    ]
    assert all(c.endswith(" -- --host 0.0.0.0") for c in calls if c.startswith("srun "))
    router = next(c for c in calls if "--router " in c)
    assert "--router http://n1:30000 --router http://n3:30000 " in router  # node ranks 0


def test_the_slurm_script_refuses_nodes_that_do_not_split_into_servers(tmp_path: Path) -> None:
    code, calls = run_slurm_script(tmp_path, ["n1", "n2", "n3"], NODES_PER_SERVER="2")
    assert code == 2 and calls == []
