"""A worker with no imports, so that Ray starts it in about a second (tests of worker
placement, where the worker class's module is imported in every actor)."""


class Echo:
    def ping(self) -> str:
        return "echo"

    def square(self, x: int) -> int:
        return x * x
