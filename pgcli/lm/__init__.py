"""Language-model RL on generated text tasks (docs/lm.md): tasks, the policies, evaluation, supervised warm start.

- ``pgcli.lm.tasks``: the tasks (addition, sort, countdown), rewards, the vocabulary interface, prompt encoding.
- ``pgcli.lm.model``: the ``CausalLM`` interface, TinyGPT, key/value-cache ``generate``, ``completion_logprobs``
  (chunked where the model asks), ``save_policy``/``load_policy``.
- ``pgcli.lm.hf``: any Hugging Face causal LM behind ``CausalLM`` (``model=hf``: LoRA, the adapter-off reference),
  its tokenizer behind the vocabulary interface; ``pgcli.lm.random_hf`` writes a random one offline.
- ``pgcli.lm.load``: the task and the policy of a text run's config (and the weights of an earlier run).
- ``pgcli.lm.evaluation``: held-out greedy accuracy, pass@k, reward, length, a samples table per evaluation.
- ``pgcli.lm.sft``: the supervised trainer behind ``pgcli sft`` (``algo=sft``); ``pgcli.lm.reward_model``: the reward
  model's (``pgcli rm``); ``pgcli.lm.supervised``: the loop, step size and checkpoint the two share.

What a text trainer receives from ``pgcli.training.build`` (``TEXT_TRAINERS`` maps its algo config to it)::

    Trainer(algo_cfg, *, task: TextTask, policy: CausalLM, reference: CausalLM | None,
            model: LMModelConfig | HFModelConfig, seed: int, device: torch.device)

``policy`` is on ``device``, initialised from ``init=<run>`` when given (else fresh, or the pretrained weights);
``reference`` is a frozen copy of the ``init`` weights (``requires_grad`` off, eval mode), the policy with its LoRA
adapters off (``model=hf``), or None. ``model`` is the validated model config: its ``temperature`` and ``top_p`` are
the rollouts' sampling settings (and the temperature of ``completion_logprobs``).
A "step" is one sampled completion: ``learn(total_steps, monitor)`` samples that many completions, calling
``monitor.log(step, {"train/...": ...})`` and ``monitor.update(step, agent=self)`` after each update (and, to get
``rollout/ep_return_mean`` / ``rollout/ep_len_mean`` as for control runs, ``monitor.add_episodes(step, rewards,
completion_lengths)`` for each sampled batch); the monitor's
text evaluator reads ``self.policy`` for ``eval/accuracy`` etc. ``save(dir)`` must write the weights with
``pgcli.lm.model.save_policy(self.policy, dir)`` (plus optimiser/RNG state for checkpoints) so that ``pgcli eval``
and ``init=<run>`` find ``dir/policy.pt``.
"""
