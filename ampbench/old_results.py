"""Results of earlier schema versions, read as this one (results.read_arm_results)."""

from __future__ import annotations

UNRECORDED = "not recorded (schema version 1)"


def upgrade_v1(old: dict) -> dict:
    """Results of schema version 1 (ampbench before its measurement protocol) in schema 2.

    Nothing is made up: what version 1 did not record says so (UNRECORDED, an empty image
    shape, no warm-up), and its figures keep their meaning: its time holds the first epoch's
    one-time costs, its peak memory counts the data set and the model. The comparison warns.
    """
    hyperparameters = old["hyperparameters"]
    dataset = old["dataset"]
    batch = hyperparameters["batch_size"]
    epoch_images = dataset["train_images"] // batch * batch  # full batches only
    return {
        "schema_version": 2,
        "precision": {
            "requested": old["precision"],
            "resolved": old["resolved_precision"],
            "autocast_dtype": old["autocast_dtype"],
            "grad_scaler": old["grad_scaler"],
            "tf32": old["tf32_matmul"],
            "emulated": False,
            "support": UNRECORDED,
        },
        "device": {"type": old["device"], "name": old["device_name"], "capability": UNRECORDED},
        "model": old["model"],
        "parameters": old["parameters"],
        "hyperparameters": hyperparameters,
        "dataset": {**dataset, "image_shape": []},
        "accuracy": old["accuracy"],
        "test_loss": old["test_loss"],
        "timing": _timing_v1(old, len(old["epochs"]) * epoch_images),
        "memory": _memory_v1(old),
        "skipped_steps": old["skipped_steps"],
        "loss_scale": old["loss_scale"],
        "resumed_from": old["resumed_from"],
        "versions": old["versions"],
        "epochs": [_epoch_v1(epoch, epoch_images) for epoch in old["epochs"]],
        "mlflow": old.get("mlflow"),
        "requested_resources": old.get("requested_resources"),
        "upgraded_from_schema": 1,
    }


def _timing_v1(old: dict, trained_images: int) -> dict:
    """Schema 1's times in schema 2: its compilation was its only warm-up."""
    train_time = old["train_time_s"]
    extra_time = sum(old.get(key) or 0.0 for key in ("eval_time_s", "checkpoint_time_s"))
    compile_time = old.get("compile_time_s") or 0.0
    return {
        "train_time_s": train_time,
        "throughput_img_s": old.get("throughput_img_s") or trained_images / train_time,
        "trained_images": trained_images,
        "end_to_end_s": compile_time + train_time + extra_time,
        "warmup_s": compile_time,
        "warmup_steps": 0,
        "compile_s": compile_time,
        "eval_s": old.get("eval_time_s") or 0.0,
        "checkpoint_s": old.get("checkpoint_time_s") or 0.0,
    }


def _memory_v1(old: dict) -> dict:
    """Schema 1's one peak, which counted the data set and the model, as both peaks."""
    reserved = old.get("peak_memory_reserved_mb")
    return {
        "kind": {"cuda_max_allocated": "cuda_allocated"}.get(old["memory_kind"], "cpu_rss"),
        "train_peak_mb": old["peak_memory_mb"],
        "total_peak_mb": old["peak_memory_mb"],
        "resident_mb": 0.0,
        "train_peak_reserved_mb": reserved,
        "total_peak_reserved_mb": reserved,
    }


def _epoch_v1(epoch: dict, images: int) -> dict:
    """An epoch of schema 1 in schema 2; `images`: those one epoch trained on."""
    return {
        "epoch": epoch["epoch"],
        "train_loss": epoch["train_loss"],
        "train_accuracy": epoch["train_accuracy"],
        "test_loss": epoch["test_loss"],
        "test_accuracy": epoch["test_accuracy"],
        "val_loss": epoch.get("val_loss"),
        "val_accuracy": epoch.get("val_accuracy"),
        "time_s": epoch["time_s"],
        "throughput_img_s": images / epoch["time_s"],
        "train_peak_memory_mb": epoch["peak_memory_mb"],
        "lr": epoch["lr"],
        "loss_scale": epoch["loss_scale"],
        "skipped_steps": epoch["skipped_steps"],
    }


def upgrade_v2(old: dict) -> dict:
    """Results of schema version 2 in schema 3: the same protocol and figures, without the
    process's start-up, which version 2 did not record."""
    return _timing_added(old, 2, "startup")


def upgrade_v3(old: dict) -> dict:
    """Results of schema version 3 in schema 4: the same figures; no compile cache then."""
    return _timing_added(old, 3, "compile_cache")


def _timing_added(old: dict, version: int, field: str) -> dict:
    """Results of `version` in the next, whose timing adds `field`, unrecorded (None)."""
    return {
        **old,
        "schema_version": version + 1,
        "timing": {**old["timing"], field: None},
        "upgraded_from_schema": old.get("upgraded_from_schema") or version,
    }
