"""A training checkpoint exported as an HF model folder (learner/export.py): the exported model
holds the weights the run trained, full fine-tuning and LoRA (merged) alike, and a checkpoint of
another model, or one missing weights, is refused with a message instead of exported."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from selective_rollout.config import dump_config, load_config
from selective_rollout.learner.export import export_run, find_checkpoint, run_folder_of
from selective_rollout.learner.modeling import load_policy, merged_weights

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "cpu_default.yaml"


@pytest.fixture
def start_model(tiny_model_dir: Path, smollm2_tokenizer, tmp_path: Path) -> Path:
    """The tiny model with a tokenizer beside it, as a run's start model has."""
    path = tmp_path / "start"
    shutil.copytree(tiny_model_dir, path)
    smollm2_tokenizer.save_pretrained(path)
    return path


def _run(tmp_path: Path, start: Path, state: dict[str, torch.Tensor], *overrides: str) -> Path:
    """A run folder whose latest checkpoint (iteration 3) holds ``state`` as DeepSpeed's module."""
    cfg = load_config(SHIPPED, [f"engine.model={start}", "warm_start.enabled=false", *overrides])
    run = tmp_path / "run"
    for it, module in ((1, {}), (3, state)):
        ckpt = run / "checkpoints" / f"iter_{it:08d}"
        (ckpt / "ds").mkdir(parents=True)
        torch.save({"module": module}, ckpt / "ds" / "mp_rank_00_model_states.pt")
        (ckpt / "extra_state.json").write_text(json.dumps({"iteration": it}))
    dump_config(cfg, run / "config.yaml")
    return run


def _params(path: Path) -> dict[str, torch.Tensor]:
    return dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).named_parameters())


def test_a_full_fine_tune_exports_the_checkpoints_weights(start_model: Path, tmp_path: Path):
    trained = AutoModelForCausalLM.from_pretrained(start_model, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    run = _run(tmp_path, start_model, trained.state_dict())

    assert find_checkpoint(run) == (run, run / "checkpoints" / "iter_00000003")  # the latest
    assert find_checkpoint(run / "checkpoints" / "iter_00000003")[0] == run
    assert run_folder_of(run) == run_folder_of(run / "checkpoints" / "iter_00000001") == run
    assert run_folder_of(start_model) is None
    out = export_run(run, tmp_path / "policy")
    exported = _params(out)
    for name, param in trained.named_parameters():
        assert torch.equal(exported[name], param.detach()), name
    assert (out / "tokenizer.json").is_file()


def test_lora_adapters_are_merged_as_the_engines_receive_them(start_model: Path, tmp_path: Path):
    cfg = load_config(SHIPPED, ["trainer.lora.enabled=true", "trainer.precision=fp32"]).trainer
    policy = load_policy(start_model, cfg)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:  # zero at start: make the adapters do something
                p.add_(0.05 * torch.randn_like(p))
    adapters = {n: t for n, t in policy.state_dict().items() if "lora_" in n}  # what DeepSpeed saves
    run = _run(tmp_path, start_model, adapters, "trainer.lora.enabled=true", "trainer.precision=fp32")

    exported = _params(export_run(run, tmp_path / "policy"))
    expected = dict(merged_weights(policy))  # the engines' merge (export_units), not peft's
    assert set(expected) <= set(exported)
    for name, tensor in expected.items():
        assert torch.allclose(exported[name], tensor, atol=1e-6), name
    assert any(not torch.equal(exported[n], p) for n, p in _params(start_model).items())


def test_a_checkpoint_of_another_model_or_missing_weights_is_refused(start_model: Path, tmp_path: Path):
    state = AutoModelForCausalLM.from_pretrained(start_model).state_dict()
    state["model.layers.9.mlp.up_proj.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="not a checkpoint of this run's model"):
        export_run(_run(tmp_path / "a", start_model, state), tmp_path / "a" / "policy")
    del state["model.layers.9.mlp.up_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    lacking = re.escape("lacks trained weights: model.layers.0.mlp.up_proj.weight")
    with pytest.raises(ValueError, match=lacking):
        export_run(_run(tmp_path / "b", start_model, state), tmp_path / "b" / "policy")
    with pytest.raises(FileNotFoundError, match="no complete training checkpoint"):
        export_run(tmp_path, tmp_path / "c")
    assert run_folder_of(tmp_path / "c") is None


def test_policy_eval_evaluates_a_run_folder_as_its_exported_policy_with_its_config(
    start_model: Path, tmp_path: Path, monkeypatch, capsys
):
    """``policy_eval --checkpoint runs/<run>``: the run's latest checkpoint is exported on the way,
    the run's own config.yaml is used (overrides and flags on top), the temporary export is gone
    afterwards; an HF folder is evaluated as it is, with the profile's config."""
    import selective_rollout.analysis.policy_eval as policy_eval

    trained = AutoModelForCausalLM.from_pretrained(start_model, dtype=torch.float32)
    with torch.no_grad():
        next(trained.parameters()).add_(1.0)
    run = _run(tmp_path, start_model, trained.state_dict(), "eval.num_tasks=5")
    seen: list[tuple[object, Path, dict[str, torch.Tensor]]] = []

    def evaluation(cfg, model_path):
        seen.append((cfg, Path(model_path), _params(model_path)))
        return {
            "success_rate": 0.5,
            "ci95": [0.2, 0.8],
            "tasks": cfg.eval.num_tasks,
            "by_type": {},
            "failed_tasks": 0,
        }

    monkeypatch.setattr(policy_eval, "run_evaluation", evaluation)
    out = tmp_path / "summary.json"
    assert policy_eval.main(["--checkpoint", str(run), "--tries", "3", "--sampled", "--out", str(out)]) == 0
    cfg, exported, params = seen[-1]
    assert cfg.engine.model == str(start_model) and cfg.eval.num_tasks == 5  # the run's config
    assert cfg.eval.tries == 3 and not cfg.eval.greedy
    for name, param in trained.named_parameters():
        assert torch.equal(params[name], param.detach()), name
    assert not exported.exists()  # the export was temporary
    assert json.loads(out.read_text())["tasks"] == 5 and "50.0%" in capsys.readouterr().out

    assert policy_eval.main(["--checkpoint", str(start_model), "--num-tasks", "2"]) == 0
    cfg, exported, _ = seen[-1]
    assert exported == start_model and cfg.eval.num_tasks == 2 and cfg.name == load_config(SHIPPED).name
    assert policy_eval.main(["--checkpoint", str(tmp_path / "nowhere")]) == 2


def test_a_run_that_started_from_a_warm_start_exports_it_or_says_how_to_build_it(
    start_model: Path, tmp_path: Path
):
    """The export finds the warm start a run started from by its key (warm_start_cache), without
    building it: cached, it is the base of the export; missing, one line says how to build it."""
    from selective_rollout.warm_start_cache import warm_start_dir

    trained = AutoModelForCausalLM.from_pretrained(start_model, dtype=torch.float32).state_dict()
    cache = tmp_path / "warm"
    run = _run(tmp_path, start_model, trained, "warm_start.enabled=true", f"warm_start.cache_dir={cache}")
    cfg = load_config(run / "config.yaml")
    folder = warm_start_dir(cfg, start_model)
    with pytest.raises(
        FileNotFoundError, match=r"not cached on this machine .*python -m selective_rollout\.sft"
    ):
        export_run(run, tmp_path / "policy")
    shutil.copytree(start_model, folder)  # what the run's warm start left in the cache
    out = export_run(run, tmp_path / "policy")
    assert (out / "config.json").is_file()
