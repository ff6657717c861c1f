"""`kvmem.db.engine.WriterTurn`: SQLite's writers of one process take turns, and a background writer
(the history sweep) goes after every request's writer that is waiting."""

from __future__ import annotations

import threading

from kvmem.db.engine import WriterTurn
from tests.support.apps import wait_until


def test_a_waiting_writer_goes_before_a_background_writer_that_waited_longer() -> None:
    turn = WriterTurn()
    order: list[str] = []

    def take(name: str, background: bool) -> None:
        with turn.turn(background=background):
            order.append(name)

    with turn.turn():
        sweep = threading.Thread(target=take, args=("sweep", True))
        sweep.start()
        write = threading.Thread(target=take, args=("write", False))
        write.start()
        wait_until(lambda: turn.waiting == 1, 10, "the write waiting for its turn")
        order.append("holder")
    write.join()
    sweep.join()
    assert order == ["holder", "write", "sweep"]


def test_writers_take_turns_one_at_a_time() -> None:
    turn = WriterTurn()
    inside: list[int] = []
    overlaps: list[int] = []

    def write(background: bool) -> None:
        for _ in range(200):
            with turn.turn(background=background):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                inside.pop()

    threads = [threading.Thread(target=write, args=(n % 2 == 0,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (overlaps, turn.waiting) == ([], 0)
