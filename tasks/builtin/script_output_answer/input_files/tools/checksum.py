"""Print the Adler-32 checksum of a file as 8 lowercase hex digits."""

import sys
import zlib


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: checksum.py FILE")
    with open(sys.argv[1], "rb") as f:
        print("%08x" % (zlib.adler32(f.read()) & 0xFFFFFFFF))


if __name__ == "__main__":
    main()
