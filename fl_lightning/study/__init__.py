"""Comparison studies: several arms x seeds of ``fl-lightning fit``, summary tables, plots, W&B groups.

See ``docs/comparing.md``; the command line is ``fl-lightning-compare STUDY.yaml``.
"""

from fl_lightning.study.callback import CompletionMarker, WandbRunSummary
from fl_lightning.study.compare import StudyResult, run_study
from fl_lightning.study.spec import Arm, StudySpec, WandbSpec, load_study, study_from_dict

__all__ = [
    "Arm",
    "CompletionMarker",
    "StudyResult",
    "StudySpec",
    "WandbRunSummary",
    "WandbSpec",
    "load_study",
    "run_study",
    "study_from_dict",
]
