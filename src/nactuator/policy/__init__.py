"""Force-aware behaviour cloning (issue 19): tasks with success criteria in the hidden
world, a scripted expert's demonstrations, a small transformer policy over an 8-step
observation history, its closed-loop evaluation in the world, per input condition
(position only, + the frozen actuator model's force estimate, + raw servo telemetry,
+ the true force).

May import models, rollout, world (for the task world and evaluation only: a policy never
sees it when deployed), hardware (deployment), data (the demo writer), platforms.
Nothing imports ``policy`` except ``cli``.
"""
