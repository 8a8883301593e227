"""A silent CPU burner: spins on one core until killed, emitting nothing (no spans, no
metrics). ``make engines`` starts one per core beside a real vLLM; only procfs can see it."""

import signal
import sys


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


if __name__ == "__main__":
    main()
