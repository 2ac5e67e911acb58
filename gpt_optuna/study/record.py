"""What a study records about itself: the names of its user attrs and of its trials', and its folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

STUDIES = Path("studies")
"""The project's own folder for study databases and study folders: the one folder made on demand."""

FINGERPRINT_ATTR = "gpt_optuna"
"""What makes a study: model, backend, criterion, space; a resume with another is refused."""
MEASURE_ATTR = "measure_settings"
"""The latency protocol of the latest search (it may change between resumes, so it is not in the fingerprint)."""
SPACE_ATTR = "space_record"
"""The whole search space (:meth:`Space.to_record`), for workers that join from other hosts."""
SEARCH_ATTR = "search"
"""The latest search's sampler and trial target, which joining workers follow."""
FOLDER_ATTR = "study_folder"
"""The study folder (absolute): cached data, transformed models and logs, found from any directory."""
CONFIRMED_ATTR = "confirmed"
"""The finalists' re-measurement: their ranking, speedups and intervals."""
ARTIFACTS_ATTR = "artifact_store"
"""The artifact store's folder, as the study's creator gave it (absolute)."""
DATA_ATTR = "shared_data"
"""file name -> {"artifact": id, "sha256": hash} of each data file in the store."""

WHY_TRIED = ("baseline", "seeded", "warm_start_from")
"""The trial user attrs that say why a candidate was tried: a retry keeps them."""
IO_CHANGE_ATTR = "io_dtypes"
"""Trial user attr: the dtypes the trial's model changed at its inputs and outputs, where it changed
any (only in a study that allowed it)."""


def study_folder(study: optuna.Study) -> Path:
    """The folder of the study's cached data and transformed models: the one it recorded, else
    ``studies/<name>`` here (studies made before it was recorded)."""
    recorded = study.user_attrs.get(FOLDER_ATTR)
    return Path(recorded) if recorded else (STUDIES / study.study_name).resolve()
