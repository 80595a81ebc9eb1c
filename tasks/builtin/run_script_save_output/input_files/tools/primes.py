"""Print the primes below a limit, ten per line, then a count line."""

import sys


def primes_below(n):
    sieve = [True] * n
    sieve[:2] = [False, False][:n]
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = [False] * len(sieve[i * i::i])
    return [i for i, p in enumerate(sieve) if p]


def main():
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    ps = primes_below(limit)
    for k in range(0, len(ps), 10):
        print(" ".join(str(p) for p in ps[k:k + 10]))
    print("count: %d" % len(ps))


if __name__ == "__main__":
    main()
