"""Several CPU workers on one machine (`torchdeck worker/up --workers N`): their commands, the torch threads
split between them, the refusals, and two real workers running two runs side by side."""

from __future__ import annotations

import subprocess

import psutil
import pytest
import typer
from typer.testing import CliRunner

from app.auth import local_user
from app.cli import app as cli
from app.cli import processes
from app.cli.processes import check_cpu_workers, cpu_threads, worker_commands
from app.cli.start import _up_workers, _worker_commands
from app.services.runs import cancel
from db.repo import get_run
from tests.worker.conftest import ROOT, wait_for


def _node(cmd: list[str]) -> str:
    return cmd[cmd.index("-n") + 1]


@pytest.fixture
def machine(monkeypatch):
    """A machine of 8 cores (4 physical), no GPU, and no thread setting in the environment."""
    monkeypatch.setattr(processes, "cpu_cores", lambda: 8)
    monkeypatch.setattr(processes, "physical_cores", lambda: 4)
    monkeypatch.setattr(processes, "gpu_count", lambda: 0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    return monkeypatch


def test_n_cpu_workers_have_unique_names_the_first_one_cpu(machine):
    cmds = worker_commands(None, None, cpu_workers=3)
    assert [_node(c) for c, _ in cmds] == ["cpu@%h", "cpu2@%h", "cpu3@%h"]  # compose's healthcheck pings cpu@$HOSTNAME
    for cmd, env in cmds:
        assert cmd[cmd.index("-Q") + 1] == "cpu" and cmd[cmd.index("-P") + 1] == "solo"
        assert env["CUDA_VISIBLE_DEVICES"] == ""
    ((one, _),) = worker_commands(None, ["gpu", "cpu"])
    assert _node(one) == "cpu@%h" and one[one.index("-Q") + 1] == "gpu,cpu"


@pytest.mark.parametrize(("n", "threads"), [(1, "4"), (2, "2"), (3, "1"), (4, "1"), (8, "1")])
def test_the_physical_cores_are_split_between_the_workers(machine, n, threads):
    cmds = worker_commands(None, ["cpu"], cpu_workers=n)
    assert len(cmds) == n
    assert {(env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) for _, env in cmds} == {(threads, threads)}


def test_a_thread_count_set_in_the_environment_wins(machine):
    machine.setenv("OMP_NUM_THREADS", "3")
    assert {(e["OMP_NUM_THREADS"], e["MKL_NUM_THREADS"]) for _, e in worker_commands(None, None, cpu_workers=2)} == {
        ("3", "3")
    }
    machine.setenv("MKL_NUM_THREADS", "5")
    assert cpu_threads(2) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "5"}
    assert cpu_threads(2, {}) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}  # what the environment gives
    assert cpu_threads(2, {"OMP_NUM_THREADS": ""})["OMP_NUM_THREADS"] == "2"  # empty: not set


def test_gpu_hosts_keep_one_worker_per_gpu(machine):
    with pytest.raises(ValueError, match="one worker per GPU"):
        worker_commands([0, 1], ["gpu"], cpu_workers=2)
    cmds = worker_commands([0, 1], ["gpu"], cpu_workers=1)
    assert [_node(c) for c, _ in cmds] == ["gpu0@%h", "gpu1@%h"]
    assert [env for _, env in cmds] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]


@pytest.mark.parametrize(("n", "message"), [(0, "at least 1"), (-2, "at least 1"), (9, "more than the 8 CPU core")])
def test_a_worker_count_that_does_not_fit_is_refused(machine, n, message):
    with pytest.raises(ValueError, match=message):
        check_cpu_workers(n)
    with pytest.raises(ValueError, match=message):
        worker_commands(None, ["cpu"], cpu_workers=n)


def test_queues_cpu_with_workers_asks_for_cpu_workers_even_on_a_gpu_host(machine):
    machine.setattr(processes, "gpu_count", lambda: 2)
    assert [_node(c) for c, _ in _worker_commands(None, ["cpu"], 2)] == ["cpu@%h", "cpu2@%h"]
    assert [_node(c) for c, _ in _worker_commands(None, ["cpu"], None)] == ["gpu0@%h", "gpu1@%h"]  # as before
    assert [_node(c) for c, _ in _worker_commands(None, None, 1)] == ["gpu0@%h", "gpu1@%h"]
    with pytest.raises(typer.Exit) as refused:
        _worker_commands(None, None, 2)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker", "--gpus", "0,1", "--workers", "2"], "one worker per GPU"),
        (["worker", "--queues", "cpu", "--workers", "0"], "at least 1"),
        (["worker", "--queues", "cpu", "--workers", "9"], "more than the 8 CPU core"),
        (["up", "--no-ui", "--workers", "9"], "more than the 8 CPU core"),
        (["up", "--no-ui", "--workers", "0"], "at least 1"),
    ],
)
def test_the_cli_refuses_before_anything_starts(machine, tmp_path, args, message):
    machine.setenv("TORCHDECK_HOME", str(tmp_path))
    machine.setattr(processes.ProcessGroup, "start", lambda *a, **k: pytest.fail("a process was started"))
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 2, done.output
    assert message in done.output
    assert not (tmp_path / "torchdeck.db").exists(), "the database was touched before the refusal"


def test_up_keeps_one_worker_on_a_gpu_machine_and_says_how_many_it_runs(machine, tmp_path):
    assert _up_workers(2)[1] == "workers: 2 CPU worker(s) side by side, 2 torch thread(s) each"
    assert _up_workers(1)[1] == "workers: 1 CPU worker(s) side by side, 4 torch thread(s) each"
    machine.setattr(processes, "gpu_count", lambda: 2)
    commands, banner = _up_workers(1)
    assert len(commands) == 1 and banner == "workers: 1, with this machine's 2 GPU(s) and 4 torch thread(s)"
    machine.setenv("TORCHDECK_HOME", str(tmp_path))
    done = CliRunner().invoke(cli, ["up", "--no-ui", "--workers", "2"])
    assert done.exit_code == 2 and "one worker per GPU" in done.output and "2 GPU(s)" in done.output


def _start(stack, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    name = _node(cmd).split("@")[0]
    log = open(stack.home / f"{name}.log", "ab")  # noqa: SIM115 - kept open for the worker's life
    p = subprocess.Popen(
        cmd, cwd=ROOT, env={**stack.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    stack.workers[name] = p  # stopped by the stack fixture
    return p


def _points(stack, run_id: str) -> int:
    from sqlalchemy import func, select

    from db.models import Metric

    with stack.engine.connect() as c:
        return c.execute(
            select(func.count()).select_from(Metric).where(Metric.run_id == run_id, Metric.key == "train/loss")
        ).scalar()


def test_two_cpu_workers_run_two_runs_side_by_side(stack, monkeypatch):
    monkeypatch.setattr(processes, "cpu_cores", lambda: 2)  # whatever this machine has: two workers fit
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    stack.env.pop("MKL_NUM_THREADS", None)  # set only by worker_commands below (OMP_NUM_THREADS=1 is the tests')
    workers = [_start(stack, cmd, env) for cmd, env in worker_commands(None, ["cpu"], cpu_workers=2)]
    for w in workers:  # the thread setting reaches each worker's run process (torch reads it at import)
        assert stack.run_process(w).environ().get("MKL_NUM_THREADS") == "1"
    ids = [stack.submit("train.epochs=500", name=f"side-{i}") for i in (1, 2)]  # neither can end during the test

    def side_by_side():
        runs = [get_run(stack.engine, i) for i in ids]
        both = all(r.status == "running" for r in runs) and all(_points(stack, i) > 0 for i in ids)
        return runs if both else None

    runs = wait_for(side_by_side, 240, f"the two runs never trained at the same time\n{stack.logs()}", every=0.3)
    assert {r.worker_id.split("@")[0] for r in runs} == {"cpu", "cpu2"}, [r.worker_id for r in runs]
    seen = {i: _points(stack, i) for i in ids}
    wait_for(
        lambda: all(_points(stack, i) > seen[i] + 20 for i in ids),
        240,
        f"the two runs did not both keep training\n{stack.logs()}",
    )
    assert all(get_run(stack.engine, i).status == "running" for i in ids)
    for i in ids:
        cancel(i, engine=stack.engine, by=local_user())
    done = [stack.wait(i, timeout=180) for i in ids]
    assert [r.status for r in done] == ["cancelled", "cancelled"], [(r.status, r.error) for r in done]
    assert all(psutil.pid_exists(w.pid) and w.poll() is None for w in workers), "a worker died"
