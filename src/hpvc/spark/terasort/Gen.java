package hpvc.terasort;

import java.io.IOException;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.zip.CRC32;
import org.apache.hadoop.fs.Path;
import org.apache.spark.api.java.JavaSparkContext;

/** {@code gen ROWS OUT}: gensort records 0..ROWS-1, partition i in OUT/part-0000i. */
final class Gen {
    private static final int CHUNK_RECORDS = 4096;

    private Gen() {}

    static int run(JavaSparkContext sc, long rows, String out, int asked, TeraSort.Timer timer)
            throws IOException {
        if (rows < 0) {
            throw new IllegalArgumentException("ROWS must be >= 0, not " + rows);
        }
        String dir = TeraSort.freshDir(out).toString();
        int parts = TeraSort.partitionsFor(sc, rows * (long) Records.SIZE, asked);
        List<Integer> index = new ArrayList<>();
        for (int i = 0; i < parts; i++) {
            index.add(i);
        }
        List<long[]> stats = sc.parallelize(index, parts)
                .map(i -> write(dir, rows, parts, i))
                .collect();
        timer.phase("gen");
        long records = 0;
        long[] sums = new long[stats.size()];
        for (int i = 0; i < sums.length; i++) {
            records += stats.get(i)[0];
            sums[i] = stats.get(i)[1];
        }
        System.out.printf("TERAGEN records=%d checksum=%s partitions=%d%n",
                records, TeraSort.hex(TeraSort.sumUnsigned(sums)), parts);
        return 0;
    }

    /** First record of partition i when ROWS are split into PARTS nearly equal runs. */
    static long first(long rows, int parts, int i) {
        return rows / parts * i + Math.min(i, rows % parts);
    }

    /** Write partition i; {records, sum of CRC32s}. */
    static long[] write(String dir, long rows, int parts, int i) throws IOException {
        long from = first(rows, parts, i);
        long to = first(rows, parts, i + 1);
        Path path = new Path(dir, TeraSort.partName(i));
        byte[] buf = new byte[CHUNK_RECORDS * Records.SIZE];
        CRC32 crc = new CRC32();
        long sum = 0;
        Records.Rand rand = Records.Rand.skipAhead(from);
        try (OutputStream os = TeraSort.fs(path).create(path, true)) {
            int n = 0;
            for (long row = from; row < to; row++) {
                rand.next();
                int off = n * Records.SIZE;
                Records.fill(buf, off, rand, row);
                sum += Records.crc(crc, buf, off);
                if (++n == CHUNK_RECORDS) {
                    os.write(buf, 0, n * Records.SIZE);
                    n = 0;
                }
            }
            os.write(buf, 0, n * Records.SIZE);
        }
        return new long[] {to - from, sum};
    }
}
