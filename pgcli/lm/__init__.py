"""Language-model RL on generated text tasks (docs/lm.md): tasks, the TinyGPT policy, evaluation, supervised warm start.

- ``pgcli.lm.tasks``: character vocabulary, the tasks (addition, sort, countdown), rewards, prompt encoding.
- ``pgcli.lm.model``: TinyGPT, key/value-cache ``generate``, ``completion_logprobs``, ``save_policy``/``load_policy``.
- ``pgcli.lm.evaluation``: held-out greedy accuracy, pass@k, reward, length, a samples table per evaluation.
- ``pgcli.lm.sft``: the supervised trainer behind ``pgcli sft`` (``algo=sft``).

What a text trainer receives from ``pgcli.training.build`` (``TEXT_TRAINERS`` maps its algo config to it)::

    Trainer(algo_cfg, *, task: TextTask, policy: TinyGPT, reference: TinyGPT | None, model: LMModelConfig,
            seed: int, device: torch.device)

``policy`` is on ``device``, initialised from ``init=<run>`` when given (else fresh); ``reference`` is a frozen copy
of the ``init`` weights (``requires_grad`` off, eval mode) or None when the run has no ``init``. ``model`` is the
validated ``pgcli.config.LMModelConfig``: its ``temperature`` and ``top_p`` are the rollouts' sampling settings (and
the temperature of ``completion_logprobs``).
A "step" is one sampled completion: ``learn(total_steps, monitor)`` samples that many completions, calling
``monitor.log(step, {"train/...": ...})`` and ``monitor.update(step, agent=self)`` after each update (and, to get
``rollout/ep_return_mean`` / ``rollout/ep_len_mean`` as for control runs, ``monitor.add_episodes(step, rewards,
completion_lengths)`` for each sampled batch); the monitor's
text evaluator reads ``self.policy`` for ``eval/accuracy`` etc. ``save(dir)`` must write the weights with
``pgcli.lm.model.save_policy(self.policy, dir)`` (plus optimiser/RNG state for checkpoints) so that ``pgcli eval``
and ``init=<run>`` find ``dir/policy.pt``.
"""
