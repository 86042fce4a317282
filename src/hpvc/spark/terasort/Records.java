package hpvc.terasort;

import java.io.Serializable;
import java.util.Arrays;
import java.util.Comparator;
import java.util.zip.CRC32;

/**
 * The sort benchmark's 100-byte records and the generator they come from.
 *
 * <p>Layout: gensort 1.5's binary record ("gen_rec" in gensort.c, Chris Nyberg,
 * sortbenchmark.org; the same as Hadoop's GenSort.generateRecord), for the
 * 128-bit random value R of the record and its record number N:
 *
 * <pre>
 *   bytes  0..9   key: the 10 most significant bytes of R
 *   bytes 10..11  0x00 0x11
 *   bytes 12..43  N as 32 upper-case hexadecimal digits
 *   bytes 44..47  0x88 0x99 0xAA 0xBB
 *   bytes 48..95  12 groups of 4 equal bytes: the hex digits of R's low 48 bits
 *   bytes 96..99  0xCC 0xDD 0xEE 0xFF
 * </pre>
 *
 * (The "\r\n" ending belongs to gensort's ASCII records, option -a, not to these.)
 *
 * <p>R comes from gensort's 128-bit linear congruential generator (rand16.c;
 * Hadoop's Random16): X' = A*X + C mod 2^128, starting from X = 0; record N
 * uses the state after N+1 steps. A partition starting at record S skips ahead
 * S steps by squaring the step function, so a given number of rows yields the
 * same bytes however it is split, exactly as "gensort -b S" does.
 */
final class Records {
    static final int SIZE = 100;
    static final int KEY = 10;

    static final long A_HI = 0x2360ed051fc65da4L;
    static final long A_LO = 0x4385df649fccf645L;
    static final long C_HI = 0x4a696d4772617952L;
    static final long C_LO = 0x4950202020202001L;

    private static final byte[] HEX = "0123456789ABCDEF".getBytes();

    private Records() {}

    /** The high 64 bits of the unsigned 128-bit product x * y. */
    static long mulHi(long x, long y) {
        return Math.multiplyHigh(x, y) + ((x >> 63) & y) + ((y >> 63) & x);
    }

    /** The state of the generator, 128 bits as two longs; mutable for speed. */
    static final class Rand {
        long hi;
        long lo;

        /** this = a * this + c (mod 2^128). */
        void apply(long aHi, long aLo, long cHi, long cLo) {
            long pHi = mulHi(aLo, lo) + aLo * hi + aHi * lo;
            long pLo = aLo * lo;
            long sLo = pLo + cLo;
            long carry = Long.compareUnsigned(sLo, pLo) < 0 ? 1 : 0;
            hi = pHi + cHi + carry;
            lo = sLo;
        }

        void next() {
            apply(A_HI, A_LO, C_HI, C_LO);
        }

        /** The state after n steps from 0 (gensort's skip_ahead_rand). */
        static Rand skipAhead(long n) {
            Rand r = new Rand();
            long aHi = A_HI;
            long aLo = A_LO;
            long cHi = C_HI;
            long cLo = C_LO;
            while (n != 0) {
                if ((n & 1) != 0) {
                    r.apply(aHi, aLo, cHi, cLo);
                }
                // f(f(x)) = a*a*x + (a*c + c): the step for twice as many rows.
                Rand c2 = new Rand();
                c2.hi = cHi;
                c2.lo = cLo;
                c2.apply(aHi, aLo, cHi, cLo);
                long sqHi = mulHi(aLo, aLo) + 2 * aLo * aHi;
                aLo = aLo * aLo;
                aHi = sqHi;
                cHi = c2.hi;
                cLo = c2.lo;
                n >>>= 1;
            }
            return r;
        }
    }

    /** Write record number {@code row} drawn from state {@code r} at {@code buf[off..off+100)}. */
    static void fill(byte[] buf, int off, Rand r, long row) {
        long hi = r.hi;
        long lo = r.lo;
        for (int i = 0; i < 8; i++) {
            buf[off + i] = (byte) (hi >>> (56 - 8 * i));
        }
        buf[off + 8] = (byte) (lo >>> 56);
        buf[off + 9] = (byte) (lo >>> 48);
        buf[off + 10] = 0x00;
        buf[off + 11] = 0x11;
        for (int i = 0; i < 16; i++) { // the high 64 bits of the 128-bit row number: 0
            buf[off + 12 + i] = '0';
        }
        for (int i = 0; i < 16; i++) {
            buf[off + 28 + i] = HEX[(int) ((row >>> (60 - 4 * i)) & 0xF)];
        }
        buf[off + 44] = (byte) 0x88;
        buf[off + 45] = (byte) 0x99;
        buf[off + 46] = (byte) 0xAA;
        buf[off + 47] = (byte) 0xBB;
        for (int i = 0; i < 12; i++) {
            byte digit = HEX[(int) ((lo >>> (44 - 4 * i)) & 0xF)];
            int at = off + 48 + 4 * i;
            buf[at] = digit;
            buf[at + 1] = digit;
            buf[at + 2] = digit;
            buf[at + 3] = digit;
        }
        buf[off + 96] = (byte) 0xCC;
        buf[off + 97] = (byte) 0xDD;
        buf[off + 98] = (byte) 0xEE;
        buf[off + 99] = (byte) 0xFF;
    }

    /** Unsigned byte-wise order of the 10-byte keys at a[aOff..] and b[bOff..]. */
    static int compareKeys(byte[] a, int aOff, byte[] b, int bOff) {
        return Arrays.compareUnsigned(a, aOff, aOff + KEY, b, bOff, bOff + KEY);
    }

    /** CRC32 (zlib's) of the record at buf[off..off+100): valsort sums these. */
    static long crc(CRC32 crc, byte[] buf, int off) {
        crc.reset();
        crc.update(buf, off, SIZE);
        return crc.getValue();
    }

    /** The order records are sorted in: their keys, unsigned, byte by byte. */
    static final class KeyOrder implements Comparator<byte[]>, Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public int compare(byte[] a, byte[] b) {
            return compareKeys(a, 0, b, 0);
        }
    }
}
