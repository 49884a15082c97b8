"""Runs of several GPUs in the dashboard and the CLI: the form's worded GPU field under Advanced, the warning when
no live worker offers that many GPUs (New run, Run page, Overview, `torchdeck submit`), the Workers page's
multi-GPU workers, and the Run page's batch per rank and in total."""

from __future__ import annotations

import yaml
from markdown_view import shown
from seeding import seed_run
from typer.testing import CliRunner

from app.cli import app as cli
from app.present import new_run_hints
from app.services.broker import queue_status
from db import repo
from db.types import EventInput

MULTI = ["gpu-x2", "gpu-x3", "gpu-x4"]
NO_FOUR = "no live worker offers 4 GPUs (the most is 1)"
START_FOUR = "torchdeck worker --gpus 0,1,2,3 --multi-gpu"


def _click(at, label: str):
    next(b for b in at.button if b.label == label).click()
    return at.run()


def _worker(engine, worker_id: str, queues: list[str], gpus: int = 1) -> None:
    devices = [{"kind": "gpu", "index": i, "util": 0.0, "mem_mb": 10.0} for i in range(gpus)]
    repo.upsert_worker(engine, worker_id, hostname="box", queues=queues, devices=devices)


def test_the_gpu_count_has_a_worded_label_under_the_resources_advanced_area_defaulting_to_one(page):
    at = page("new_run.py")
    field = at.number_input(key="nr.f.resources.gpus")
    assert field.label == "GPUs (processes) for this run" and field.value == 1
    advanced = [e for e in at.expander if e.label == "Advanced"]
    holder = [e for e in advanced if any(w.key == "nr.f.resources.gpus" for w in e.number_input)]
    assert len(holder) == 1 and any(w.key == "nr.f.loader.num_workers" for w in holder[0].number_input)


def test_the_new_run_hint_names_the_gpu_gap_and_the_command_that_closes_it(page, engine):
    _worker(engine, "gpu0@box/1-aa", ["gpu"])
    at = page("new_run.py")
    at.number_input(key="nr.f.resources.gpus").set_value(4)
    at.number_input(key="nr.f.train.batch_size").set_value(128)
    at = _click(at, "Validate")
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert NO_FOUR in warnings and START_FOUR in warnings and "gpu-x4" in warnings
    assert any("queue 'gpu-x4'" in s.value for s in at.success)
    at.selectbox(key="nr.f.device").set_value("cpu")  # a CPU worker runs the 4 gloo processes: no warning
    _worker(engine, "cpu@box/2-bb", ["cpu"], gpus=0)
    at = _click(at, "Validate")
    assert not any("no live worker" in w.value for w in at.warning)
    assert any("runs its 4 processes" in shown(i.value).text for i in at.info)


def test_worker_hint_for_each_kind_of_run(engine):
    _worker(engine, "gpu0@box/1-aa", ["gpu"])
    gap = new_run_hints.worker_hint("gpu-x4", engine, 4)
    assert not gap.served and NO_FOUR in gap.text and START_FOUR in gap.text
    _worker(engine, "gpu0-1@box/3-cc", ["gpu-x2"], gpus=2)
    assert "(the most is 2)" in new_run_hints.worker_hint("gpu-x4", engine, 4).text
    assert "lower resources.gpus to 2" in new_run_hints.worker_hint("gpu-x4", engine, 4).text
    assert new_run_hints.worker_hint("gpu-x2", engine, 2).served
    assert new_run_hints.worker_hint("gpu", engine).served  # single-GPU runs: as before


def test_the_run_page_and_the_overview_say_no_worker_can_take_a_queued_four_gpu_run(page, engine):
    _worker(engine, "gpu0@box/1-aa", ["gpu"])
    r = seed_run(engine, "ddp-4", status="queued", spec={"train": {"batch_size": 128}, "resources": {"gpus": 4}})
    at = page("run.py", id=r.id)
    assert not at.exception
    assert any(
        NO_FOUR.lower() in w.value.lower() and START_FOUR in w.value for w in at.warning
    )  # a sentence: capitalised
    import streamlit as st

    st.cache_data.clear()
    at = page("overview.py")
    queued = next(d.value for d in at.dataframe if "who can take it" in d.value)
    row = queued.set_index("run").loc["ddp-4"]
    assert row["queue"] == "gpu-x4" and row["who can take it"] == NO_FOUR


def test_the_workers_page_shows_a_multi_gpu_worker_and_what_it_takes(page, engine):
    _worker(engine, "gpu0-3@box/1-aa", MULTI, gpus=4)
    _worker(engine, "gpu4@box/2-bb", ["gpu"])
    waiting = seed_run(engine, "ddp-2", status="queued", spec={"resources": {"gpus": 2}})
    at = page("workers.py")
    workers, queue = at.dataframe[0].value, at.dataframe[1].value
    takes = dict(zip(workers["worker"], workers["takes"], strict=True))
    assert takes == {"gpu0-3@box/1-aa": "4 GPUs (runs of 2–4)", "gpu4@box/2-bb": "1 GPU per run"}
    assert queue.set_index("open").loc[f"run?id={waiting.id}", "queue"] == "gpu-x2"


def test_the_run_page_shows_batch_per_rank_and_total_and_the_learning_rate(page, engine):
    r = seed_run(
        engine,
        "ddp-run",
        status="running",
        lr=0.1,
        spec={"train": {"epochs": 3, "batch_size": 128}, "resources": {"gpus": 4}},
    )
    at = page("run.py", id=r.id)
    assert not at.exception
    line = next(shown(c.value).text for c in at.caption if "Processes:" in c.value)
    assert "4 processes on 4 GPUs: batch 32 per rank × 4 = 128 in total · learning rate 0.1" in line
    assert "from the spec" in line
    repo.append_events(
        engine,
        r.id,
        [
            EventInput(
                "distributed",
                "info",
                "4 ranks up (nccl)",
                data={"world_size": 4, "per_rank_batch": 32, "global_batch": 128, "lr": 0.4},
            )
        ],
    )
    at = page("run.py", id=r.id)
    line = next(shown(c.value).text for c in at.caption if "Processes:" in c.value)
    assert "batch 32 per rank × 4 = 128 in total · learning rate 0.4 (optim.lr 0.1)" in line
    assert "from the spec" not in line
    single = seed_run(engine, "one-gpu", status="running")
    at = page("run.py", id=single.id)
    assert not any("Processes:" in c.value for c in at.caption)  # a one-process run: nothing to say


def test_torchdeck_submit_stores_and_queues_a_four_gpu_run_and_warns_of_the_gap(engine, broker, tmp_path):
    _worker(engine, "gpu0@box/1-aa", ["gpu"])
    spec = tmp_path / "ddp.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"name": "ddp", "data": {"name": "digits"}, "train": {"batch_size": 128}, "resources": {"gpus": 4}}
        )
    )
    done = CliRunner().invoke(cli, ["submit", str(spec)])
    assert done.exit_code == 0, done.output
    assert "queued on 'gpu-x4'" in done.output
    assert f"warning: {NO_FOUR}" in done.output and START_FOUR in done.output
    run_id = done.output.strip().splitlines()[-1]
    assert repo.get_run(engine, run_id).status == "queued" and broker.llen("gpu-x4") == 1
    assert queue_status("gpu-x4", engine).most_gpus == 1


def test_doctor_names_the_multi_gpu_command_for_a_gpu_x_queue_nobody_consumes(engine):
    from app.cli.doctor_workers import _queues_check

    _worker(engine, "gpu0@box/1-aa", ["gpu"])
    seed_run(engine, "ddp-4", status="queued", spec={"train": {"batch_size": 128}, "resources": {"gpus": 4}})
    check = _queues_check(repo.list_workers(engine), repo.list_runs(engine, status="queued").runs, "generic fix", [])
    assert not check.ok and "1 queued run(s) need the gpu-x4 queue" in check.detail
    assert START_FOUR in check.fix and "generic fix" not in check.fix
