"""Workloads: one module per workload, each a command builder plus a pure parser/evaluator, and the parts
they share (``base``: the contract, typed evidence, targets, cache drops, summaries; ``engine``: an engine
process's lifecycle and the engine handle; ``attach``: an engine someone else runs; ``phases``: the one phase
runner engine workloads share). Importing this package registers every built-in workload in :data:`WORKLOADS`."""

from .kit.base import (WORKLOADS, Evidence, GateContext, PlannedStep, Workload, WorkloadResult,  # noqa: F401
                   register_workload)
from . import fio_read  # noqa: F401,E402
from . import nvme_integrity  # noqa: F401,E402
from . import g2_ttft  # noqa: F401,E402
from . import g2_load  # noqa: F401,E402
from . import g2_gain  # noqa: F401,E402
from . import g3_shared_read  # noqa: F401,E402
from . import r3_cross_instance  # noqa: F401,E402
from . import kv_read  # noqa: F401,E402
from . import pd_handoff  # noqa: F401,E402
from . import fio_faults  # noqa: F401,E402
from . import g2_faults  # noqa: F401,E402
from . import g2_tenancy  # noqa: F401,E402
from . import g2_answer  # noqa: F401,E402
