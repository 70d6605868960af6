"""What the papers state about their real-data runs, per paper config: the numbers ``real_data.py`` compares with.

Only numbers printed in the papers' text are here (the figures are not in the text files), each with its table
and the line of ``/work/shared/papers/<paper>.txt`` it was copied from. Where a paper gives a number, it is its
final accuracy after its own round count: none of the five papers states an accuracy at an early round.

- FedMRN (Li et al., ACM MM 2024), Table 1 (``003_...-fedmrn.txt`` lines 222-231): mean (± std over 5 runs)
  test accuracy after 100 rounds (FMNIST, SVHN) or 200 (CIFAR-10/100; §5.1.4, line 249), Non-IID-1 column, which is the
  configs' partition (Dirichlet 0.3; 0.2 for CIFAR-100, §5.1.2).
- FedSoft (Ruan & Joe-Wong, AAAI 2022), Table 8 (``002_...-fedsoft.txt`` line 554): the accuracy of the centre
  that does best on the 0° / 90° test images of CIFAR-10, 30:70 mixture, after 200 global epochs (App. C,
  line 543). No std is given. Its letters numbers (Tables 1-2, lines 260-266) are for lower- and upper-case
  sources; ``fedsoft_emnist`` rotates the letters instead, so they are not compared.
- FedALIGN, FedStaleWeight and Flexible participation: no accuracy in the text (notes §4.4, §4.7 and the
  "extraction damage" box): FedALIGN and FedStaleWeight show curves only; Flexible's Table 3 gives relative
  improvements between schemes (its |T| = 8 non-IID cells, this config's, were lost in extraction) and
  Tables 4-5 rounds-to-recovery of arrival/departure runs, which are other configs.

Tolerance, our rule (one seed of ours against the paper's mean): ``max(1.0, 3 × std)`` points where the paper
gives a std over runs, 3.0 points where it gives none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The torchvision-backed dataset classes of fl_lightning: a config that reads one is a real-data config.
REAL_DATASETS = frozenset(
    f"fl_lightning.data.{name}" for name in ("MNIST", "FashionMNIST", "EMNIST", "CIFAR10", "CIFAR100", "SVHN")
)


@dataclass(frozen=True)
class PaperNumber:
    """One accuracy (%) the paper prints, and how to read ours.

    Args:
        metric: the logged key of our accuracy (a fraction), or a pattern with ``*`` whose matches' maximum is taken.
        value: the paper's accuracy in percent.
        round: the round (1-based count) the paper reports it after.
        where: paper, table and source line.
        std: the paper's std over runs, in points, if it gives one.
    """

    metric: str
    value: float
    round: int
    where: str
    std: float | None = None

    @property
    def tolerance(self) -> float:
        """Points either side of ``value`` that count as reproduced (module docstring)."""
        return 3.0 if self.std is None else max(1.0, 3 * self.std)


@dataclass(frozen=True)
class RealDataConfig:
    """A paper config on real data (``configs/papers/<name>.yaml``) and what its paper states.

    Args:
        name: the config's file stem.
        metric: our logged accuracy to report when the paper gives no number.
        early_rounds: the rounds (aggregations, for the asynchronous configs) of the default short run.
        numbers: the paper's numbers, compared only in a run of their round count (``--full``).
        no_number: where the paper's results are and why no number is compared, when ``numbers`` is empty.
    """

    name: str
    metric: str
    early_rounds: int = 5
    numbers: tuple[PaperNumber, ...] = field(default=())
    no_number: str = ""


def _fedmrn(name: str, value: float, std: float, line: int, rounds: int = 100) -> RealDataConfig:
    where = f"FedMRN Table 1, Non-IID-1 (fedmrn.txt line {line})"
    return RealDataConfig(name, "test_acc", numbers=(PaperNumber("test_acc", value, rounds, where, std),))


_FEDALIGN = "FedALIGN Fig. 1 only: the text gives no accuracy (notes §4.4)"
_FEDSTALEWEIGHT = "FedStaleWeight Fig. 2 only: the text gives no accuracy (notes §4.7)"
_FEDSOFT_LETTERS = (
    "FedSoft Tables 1-2 (fedsoft.txt lines 260-266) are for lower/upper-case letter sources, not this config's "
    "0°/90° rotations: not comparable"
)
_FLEXIBLE = (
    "Flexible: figures only; Table 3 gives relative gains between schemes, and its non-IID |T| = 8 cells were "
    "lost in extraction (notes)"
)
_FEDSOFT_CIFAR = "FedSoft Table 8, 30:70, c*_{} (fedsoft.txt line 554); substitute: 2-conv CNN, no augmentation"

#: Every real-data paper config, in the order the table lists them.
CONFIGS: tuple[RealDataConfig, ...] = (
    _fedmrn("fedmrn_fmnist", 90.2, 0.1, 230),
    _fedmrn("fedmrn_svhn", 90.0, 0.3, 230),
    _fedmrn("fedmrn_cifar10", 84.6, 0.2, 230, rounds=200),
    _fedmrn("fedmrn_cifar100", 54.1, 0.2, 230, rounds=200),
    _fedmrn("fedmrn_fmnist_fedavg", 90.5, 0.1, 222),
    _fedmrn("fedmrn_fmnist_fedpm", 78.6, 0.2, 223),
    _fedmrn("fedmrn_fmnist_signsgd", 88.4, 0.2, 225),
    _fedmrn("fedmrn_fmnist_topk", 88.6, 0.2, 226),
    _fedmrn("fedmrn_fmnist_terngrad", 89.9, 0.2, 227),
    _fedmrn("fedmrn_fmnist_drive", 89.9, 0.2, 228),
    _fedmrn("fedmrn_fmnist_eden", 89.8, 0.2, 229),
    RealDataConfig(
        "fedsoft_cifar10",
        "round/src0_c*_acc",
        numbers=(
            PaperNumber("round/src0_c*_acc", 78.9, 200, _FEDSOFT_CIFAR.format(0)),
            PaperNumber("round/src1_c*_acc", 79.0, 200, _FEDSOFT_CIFAR.format(90)),
        ),
    ),
    RealDataConfig("fedsoft_emnist", "round/src0_c*_acc", no_number=_FEDSOFT_LETTERS),
    RealDataConfig("fedalign_fmnist", "round/priority_test_acc", no_number=_FEDALIGN),
    RealDataConfig("fedalign_emnist", "round/priority_test_acc", no_number=_FEDALIGN),
    RealDataConfig("fedalign_cifar10", "round/priority_test_acc", no_number=_FEDALIGN),
    RealDataConfig("fedstaleweight_fmnist", "test_acc", early_rounds=200, no_number=_FEDSTALEWEIGHT),
    RealDataConfig("fedstaleweight_cifar10", "test_acc", early_rounds=200, no_number=_FEDSTALEWEIGHT),
    RealDataConfig("flexible_mnist", "test_acc", no_number=_FLEXIBLE),
)
