"""The dashboard's training panel says how a job was run (wire, recomputed activations, loader workers) and,
once it ended, each link's bytes each way and bandwidth, and a lossy wire's loss distance as a report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pictl.inventory import load_cluster
from pictl.job_summaries import TrainSummary
from pictl.jobs.training.options import TrainOptions
from pictl.tui.rows import Ending
from pictl.tui.state import DashboardState
from pictl.tui.widgets.train_panel import train_grid

ROOT = Path(__file__).resolve().parents[2]


def _text(state: DashboardState) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(train_grid(state, "done"))
    return console.export_text()


def test_a_finished_job_over_a_compressed_link_shows_the_link_and_a_reported_loss_distance() -> None:
    state = DashboardState(load_cluster(ROOT / "hosts.toml"))
    state.start_train(TrainOptions(mode="pipeline", schedule="gpipe", model="mobilenetv2_100", batch_size=32,
                                   chunks=4, wire="lowrank:4", checkpoint_activations=True, workers=2))
    state.finish_train(TrainSummary.model_validate({
        "kind": "train", "status": "ok", "job_id": "j", "mode": "pipeline", "batch_size": 32, "chunks": 4,
        "microbatch": 8, "agreement": {"steps": 2, "tolerance": 0.001, "passed": False, "enforced": False,
                                       "max_rel_diff": 0.0391},
        "links": [{"link": "0->1", "cut": "blocks.2", "format": "lowrank:4", "forward_bytes_per_step": 98_304,
                   "backward_bytes_per_step": 98_304, "sender": {"avg_MBps": 4.97, "peak_MBps": 5.92},
                   "receiver": {"avg_MBps": 3.1, "peak_MBps": 4.0}}]}), Ending.of())
    text = _text(state)
    assert "wire lowrank:4, activations recomputed, 2 loader worker(s)" in text
    assert "losses moved by the wire (max rel. diff 0.0391)" in text and "DIFFER" not in text
    assert "link 0->1" in text and "lowrank:4: 98.3 kB forward, 98.3 kB back per step; 4.97 MB/s average, " \
                                   "5.92 peak" in text
