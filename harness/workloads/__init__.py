"""Workload registry. Importing this package registers every built-in workload."""

from .base import WORKLOADS, GateContext, PlannedStep, Workload, register_workload  # noqa: F401
from . import fio_read  # noqa: F401,E402
from . import nvme_integrity  # noqa: F401,E402
from . import g2_ttft  # noqa: F401,E402
from . import g3_shared_read  # noqa: F401,E402
from . import g2_multiturn  # noqa: F401,E402
from . import r3_cross_instance  # noqa: F401,E402
