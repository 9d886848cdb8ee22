"""Operations, apart from the teaching path: planning and pricing a grid (:mod:`~papa_lib.ops.plan`,
:mod:`~papa_lib.ops.costs`), running it on a Ray cluster (:mod:`~papa_lib.ops.executors`), the speed and memory
benchmarks (:mod:`~papa_lib.ops.bench`) and the device checks (:mod:`~papa_lib.ops.devices`). The command line and
the book's appendix use them; nothing a chapter teaches does, and no layer below imports them.
"""
