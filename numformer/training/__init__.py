"""Training (Section 5): the step and the loop, and everything a run needs around them.

``trainer`` (the step: forward, loss, backward, clip, Adam; the loop), ``step_hooks`` (what a run
hangs on the step), ``config`` (the settings of a run and how flags settle into them), ``epochs``
(where training stands in the data), ``metrics`` (the log lines), ``validation``, ``run_folder`` and
``run_lock`` (what a run writes, and the lock that makes it one process's), ``distributed``,
``data_parallel``, ``replicas`` and ``processes`` (several processes training one model, and how they
leave together), ``loss_scaling`` (fp16), ``gradient_statistics`` (with ``per_sentence_gradients`` and
``gradient_noise_scale``), ``tensorboard_log``, ``progress_bar`` and ``forecast`` (what a person watches).
"""
