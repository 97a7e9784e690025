"""How a spec says where its cells run: the ``executor:`` block's options (``inline``,
``local``, ``submitit``), validated with the rest of the spec. The executors themselves are
in :mod:`selbench.execution.executors`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ExecutorOptions", "InlineOptions", "LocalOptions", "Options", "SubmititOptions"]


class Options(BaseModel):
    """Options every executor takes."""

    model_config = ConfigDict(extra="forbid")

    retries: int = Field(0, ge=0, description="resubmit a failed job up to this many times")


class DistributedOptions(Options):
    # 2**16: a multiple of every power-of-two batch size, so that each shard's batches are
    # those of a whole-split extraction and the merged outputs are identical bit for bit
    shard_size: int | None = Field(
        65536, ge=1, description="rows per extraction job: a split with more rows is "
                                 "extracted by several jobs (when the backbone declares "
                                 "shardable) and merged; null: one job per split")


class InlineOptions(Options):
    """Every cell in the ``selbench`` process (the default)."""

    name: Literal["inline"] = "inline"


class LocalOptions(DistributedOptions):
    """A pool of worker processes on this machine."""

    name: Literal["local"] = "local"
    workers: int | None = Field(
        None, ge=1, description="number of worker processes (default: the number of visible "
                                "GPUs when the device is cuda and there are several, else "
                                "the number of CPU cores)")


#: submitit's own spelling of the options below (AutoExecutor.update_parameters)
_SUBMITIT_NAMES = {"time_min": "timeout_min", "gpus_per_node": "gpus_per_node",
                   "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb",
                   "partition": "slurm_partition", "array_parallelism": "slurm_array_parallelism"}


class SubmititOptions(DistributedOptions):
    """Jobs submitted with submitit's ``AutoExecutor`` (Slurm when present)."""

    name: Literal["submitit"] = "submitit"
    cluster: Literal["auto", "slurm", "local", "debug"] = Field(
        "auto", description="auto: Slurm where sbatch is available, else local processes; "
                            "debug: in this process, one job after the other")
    folder: str | None = Field(
        None, description="where submitit writes job scripts, pickles and logs "
                          "(default OUT/logs/submitit); %j is the job id")
    partition: str | None = None
    time_min: int = Field(60, ge=1, description="wall-clock limit of one job, minutes")
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: int = Field(1, ge=1)
    mem_gb: float | None = Field(None, gt=0)
    array_parallelism: int | None = Field(
        None, ge=1, description="at most this many jobs of the array run at once")
    max_requeues: int = Field(
        3, ge=0, description="times submitit requeues a preempted or timed-out Slurm job "
                             "(each attempt skips the cells already written)")
    job_name: str = "selbench"
    poll_s: float = Field(10.0, gt=0, description="seconds between status checks")
    slurm: dict[str, Any] = Field(
        default_factory=dict,
        description="other submitit Slurm options, with or without their slurm_ prefix "
                    "(e.g. account, qos, constraint, additional_parameters, setup)")

    @field_validator("slurm")
    @classmethod
    def _slurm_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in v.items():
            bare = key[len("slurm_"):] if key.startswith("slurm_") else key
            if bare in ("partition", "array_parallelism", "time", "gpus_per_node",
                        "cpus_per_task", "mem"):
                raise ValueError(f"{key!r}: set it with the executor's own option "
                                 "(partition, array_parallelism, time_min, gpus_per_node, "
                                 "cpus_per_task, mem_gb)")
            out[bare] = value
        valid = _slurm_parameters()
        if valid is not None:
            unknown = sorted(k for k in out if k not in valid)
            if unknown:
                raise ValueError(f"unknown Slurm option(s) {', '.join(map(repr, unknown))}; "
                                 f"submitit knows {', '.join(sorted(valid))}")
        return out

    def parameters(self) -> dict[str, Any]:
        """The options as ``AutoExecutor.update_parameters`` keyword arguments."""
        params: dict[str, Any] = {"name": self.job_name}
        for ours, theirs in _SUBMITIT_NAMES.items():
            value = getattr(self, ours)
            if value is not None:
                params[theirs] = value
        params.update({f"slurm_{k}": v for k, v in self.slurm.items()})
        return params


def _slurm_parameters() -> set[str] | None:
    """The Slurm options submitit accepts, or None when submitit is not installed."""
    try:
        from submitit.slurm.slurm import SlurmExecutor
    except ImportError:
        return None
    return set(SlurmExecutor._valid_parameters())


ExecutorOptions = Annotated[InlineOptions | LocalOptions | SubmititOptions,
                            Field(discriminator="name")]
