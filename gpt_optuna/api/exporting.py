"""A trial written out as ``gpt-optuna export`` writes it, with what the command says about it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna

from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import writable_file


@dataclass(frozen=True)
class Exported:
    """What an export wrote: ``path`` (the engine or model; for Triton, the model's folder), its
    JSON ``record`` (the side file ``gpt-optuna check`` reads), and what ``export`` prints."""

    path: Path
    record: Path
    lines: tuple[str, ...]


def export(
    study: optuna.Study,
    out: Path,
    trial: int | None,
    format: str,
    force: bool,
    model_name: str | None,
    storage: str,
) -> Exported:
    """The trial (default: what the study recommends deploying) to ``out`` as a file, or as a
    Triton model repository entry; nothing over a file the study (in ``storage``) reads."""
    if format == "triton":
        from gpt_optuna.results.triton import model_name as default_model_name
        from gpt_optuna.results.triton import write_repository

        new = not out.exists()
        folder, left_out, side = write_repository(
            study, trial, out, model_name or default_model_name(study), force, storage
        )
        lines = [f"wrote {folder}/config.pbtxt and the model in {folder}/1", *export_lines(side)[1:]]
        if new:
            lines.insert(0, f"made the model repository {out}")
        if left_out:
            lines.append(
                "note: the served model is not the measured configuration: Triton's model configuration has no"
                f" field for {', '.join(left_out)}, so Triton runs it without"
            )
        return Exported(folder, side, tuple(lines))
    if format != "file":
        raise UserError(f"unknown export format {format!r}: file or triton")
    from gpt_optuna.results.export import export_trial

    written, side = export_trial(study, trial, writable_file(out), force, storage=storage)
    return Exported(written, side, tuple(export_lines(side)))


def export_lines(side: Path) -> list[str]:
    """What ``export`` says: the files, the study's verdict (for its winner) or the trial's figures
    as the side file states them, and an interface that changed (``--allow-io-change``)."""
    from gpt_optuna.graph.interface import describe_changes

    written = side.with_name(side.name.removesuffix(".json"))
    record = SideFile.read(written)
    lines = [f"wrote {written} and {side}"]
    if record.headline:  # the study's winner: its verdict, as every reader says it
        lines.append(record.headline)
        yours = record.your_configuration or {}
        if record.decided and not record.winner:
            kept = (
                f"your configuration ({yours.get('file')}), trial {record.trial}"
                if yours.get("is_this_trial")
                else f"the default configuration, so this is the baseline, trial {record.trial}"
            )
            lines.append(f"note: the verdict keeps {kept}; export --trial N takes another trial")
    elif record.speedup is not None:
        interval = record.speedup_ci95
        lines.append(
            f"trial {record.trial}: {record.latency_ms:.4g} ms against the baseline's "
            f"{record.baseline_latency_ms:.4g} ms, {record.speedup:.3f}x"
            + (f" [95% CI {interval[0]:.3f}-{interval[1]:.3f}]" if interval else "")
            + f" ({record.measurement})"
        )
    interface = record.interface or {}
    if interface["changed"]:
        lines.append(
            f"note: {written.name} {describe_changes(interface['changes'])}: its study allowed"
            " I/O dtype changes (--allow-io-change); gpt_optuna.open_session converts"
        )
    return lines
