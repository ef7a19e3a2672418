from __future__ import annotations

from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"

    def ready(self) -> None:
        from tasks import cancellation, children, hooks

        # What follows a task's end, in every process that can end one, in this order: its waiting
        # parent moves on once it was the last child running, then its own running children are
        # canceled (tests/tasks/test_hooks.py holds the order).
        hooks.after_task_ended.register("tasks.children", children.after_child_ended)
        hooks.after_task_ended.register("tasks.cancellation", cancellation.after_parent_ended)
