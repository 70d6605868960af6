"""Comparison studies: several arms x seeds of ``fl-lightning fit``, summary tables, plots, W&B groups.

See ``docs/comparing.md``; the command line is ``fl-lightning-compare STUDY.yaml``.
"""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.study.callback": ("CompletionMarker", "WandbRunSummary"),
        "fl_lightning.study.compare": ("StudyResult", "run_study"),
        "fl_lightning.study.spec": ("Arm", "StudySpec", "WandbSpec", "load_study", "study_from_dict"),
    },
)
