"""Resumable JSONL jobs, shared by ``inferno batch``, ``inferno score -o`` and the Ray jobs: the rows and
their id rules (`lines`), the append-only OUT with resume (`output`), what runs first (`plan`), the
progress and summary (`progress`), and the two kinds of job (`generate`, `score`).

No argument parsing and no exit codes here: a problem with the job is a `JobError`, and a runner
returns a `JobReport` that the caller turns into its own output.
"""

from inferno.jobs.lines import JobError, LineError
from inferno.jobs.plan import JobPlan, plan_job
from inferno.jobs.progress import JobReport, Progress

__all__ = ["JobError", "JobPlan", "JobReport", "LineError", "Progress", "plan_job"]
