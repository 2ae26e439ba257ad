"""``pgcli rm env=<text task> ...``: a reward model trained on preference pairs, run as ``pgcli train algo=rm ...``
(docs/lm.md, "Reward models: `pgcli rm`").

A run of its own: the task is ``env=addition`` unless given, the algo is always ``rm``, and a run resumes with its own
algo, so ``resume=`` belongs to ``pgcli train``. ``pgcli rm --help`` is its own page (those choices marked).
"""

from __future__ import annotations

from pgcli.commands.sft import fixed_algo_main


def main(args: list[str]) -> int:
    """Entry point of ``pgcli rm``: ``pgcli train algo=rm`` (:func:`pgcli.commands.sft.fixed_algo_main`)."""
    return fixed_algo_main(args, algo="rm")
