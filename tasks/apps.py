from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"

    def ready(self) -> None:
        # A child's end moves its waiting parent on, in every process that can end a task.
        from tasks import children, transitions

        transitions.child_ended.connect(children.after_child_ended, dispatch_uid="tasks.children")
