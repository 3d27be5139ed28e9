"""One session core under step mode, autonomy and search.

``SessionCore`` (``core``) owns a session's writer, state, log and bound judge and does
every act a scheduler combines; the approval policies (``approval``) say who decides a
proposal; ``log_open`` creates session logs (with their header) and reopens recorded
ones. What a proposal's decision and base mean is decided once, beside the fold
(``approving``, ``ProposalInfo.approved``, ``proposal_base``), and re-exported here. The ``Controller``
(``sessions.control.controller``) and ``Search`` (``sessions.search``) are schedulers on this
core. Nothing here imports a front end or a scheduler (an import contract says so).
"""

from tilewright.sessions.core.approval import (
    ApprovalPolicy,
    AutoApproval,
    Decision,
    Halt,
    PersonApproval,
    SearchRules,
    Verdict,
)
from tilewright.sessions.core.core import (
    JudgeFailed,
    SessionCore,
    cancelled_result,
    failed_result,
    finished_result,
)
from tilewright.sessions.core.log_open import backend_json, create_log, recorded_options, reopen_log
from tilewright.sessions.state import approving, proposal_base

__all__ = [
    "ApprovalPolicy",
    "AutoApproval",
    "Decision",
    "Halt",
    "JudgeFailed",
    "PersonApproval",
    "SearchRules",
    "SessionCore",
    "Verdict",
    "approving",
    "backend_json",
    "cancelled_result",
    "create_log",
    "failed_result",
    "finished_result",
    "proposal_base",
    "recorded_options",
    "reopen_log",
]
