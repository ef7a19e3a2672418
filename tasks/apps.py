from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"

    def ready(self) -> None:
        # A task's end moves its waiting parent on and cancels its own running children, in every
        # process that can end a task.
        from tasks import cancellation, children, transitions

        transitions.task_ended.connect(children.after_child_ended, dispatch_uid="tasks.children")
        transitions.task_ended.connect(cancellation.after_parent_ended, dispatch_uid="tasks.cancellation")
