package hpvc.terasort;

import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.Path;
import org.apache.spark.Partitioner;
import org.apache.spark.api.java.JavaSparkContext;
import scala.Tuple2;

/**
 * {@code sort IN OUT}: sample the keys for split points, range-partition on the
 * unsigned byte-wise key order, sort within each partition, write partition i
 * to OUT/part-0000i. Every key in part i is <= every key in part i+1.
 */
final class Sort {
    /** Keys sampled per output partition (Hadoop's TeraSort samples 100k in all). */
    private static final long SAMPLES_PER_PARTITION = 1000;
    private static final long MIN_SAMPLES = 10_000;
    /**
     * Input files the sample is read from, as Hadoop's TeraSort reads it from
     * 10 evenly spaced splits: one run of consecutive records from the start of
     * each, so the sample costs a few sequential reads, not a round trip per
     * key (on a shared file system every scattered read is one).
     */
    static final int SAMPLE_RUNS = 10;
    /** Records read per call while sampling: 400 KiB. */
    private static final int SAMPLE_CHUNK = 4096;

    private Sort() {}

    static int run(JavaSparkContext sc, String in, String out, int asked, TeraSort.Timer timer)
            throws IOException {
        List<String> files = TeraSort.dataFiles(in);
        long bytes = TeraSort.totalLength(files);
        if (bytes % Records.SIZE != 0) {
            throw new IOException(in + " holds " + bytes + " bytes, not whole 100-byte records");
        }
        int parts = TeraSort.partitionsFor(sc, bytes, asked);
        String dir = TeraSort.freshDir(out).toString();
        long samples = Math.max(MIN_SAMPLES, SAMPLES_PER_PARTITION * parts);
        List<String> sampled = spread(files, SAMPLE_RUNS);
        long perRun = (samples + sampled.size() - 1) / sampled.size();
        List<byte[]> keys = new ArrayList<>(sc.parallelize(sampled, sampled.size())
                .flatMap(f -> sample(f, perRun).iterator())
                .collect());
        byte[][] splits = splits(keys, parts);
        timer.phase("sample");
        List<long[]> written = sc.binaryRecords(in, Records.SIZE)
                .mapToPair(r -> new Tuple2<byte[], Object>(r, null))
                .repartitionAndSortWithinPartitions(new KeyPartitioner(splits),
                        new Records.KeyOrder())
                .mapPartitionsWithIndex((i, it) -> write(dir, i, it), true)
                .collect();
        timer.phase("sort");
        long records = 0;
        for (long[] w : written) {
            records += w[0];
        }
        System.out.printf("TERASORT records=%d partitions=%d samples=%d%n",
                records, parts, keys.size());
        return 0;
    }

    /** Up to {@code runs} of {@code files}, evenly spaced, the first one included. */
    static List<String> spread(List<String> files, int runs) {
        if (files.size() <= runs) {
            return files;
        }
        List<String> out = new ArrayList<>(runs);
        for (int r = 0; r < runs; r++) {
            out.add(files.get((int) ((long) files.size() * r / runs)));
        }
        return out;
    }

    /** The keys of the first {@code k} records of {@code file} (fewer if it is shorter). */
    static List<byte[]> sample(String file, long k) throws IOException {
        Path path = new Path(file);
        long n = TeraSort.fs(path).getFileStatus(path).getLen() / Records.SIZE;
        long take = Math.min(k, n);
        List<byte[]> keys = new ArrayList<>((int) Math.min(take, Integer.MAX_VALUE));
        byte[] buf = new byte[SAMPLE_CHUNK * Records.SIZE];
        try (FSDataInputStream is = TeraSort.fs(path).open(path)) {
            for (long done = 0; done < take; ) {
                int now = (int) Math.min(SAMPLE_CHUNK, take - done);
                is.readFully(buf, 0, now * Records.SIZE);
                for (int r = 0; r < now; r++) {
                    keys.add(Arrays.copyOfRange(buf, r * Records.SIZE, r * Records.SIZE + Records.KEY));
                }
                done += now;
            }
        }
        return keys;
    }

    /** The parts-1 split keys at the quantiles of the sorted sample. */
    static byte[][] splits(List<byte[]> keys, int parts) {
        Collections.sort(keys, new Records.KeyOrder());
        if (keys.isEmpty()) {
            return new byte[parts - 1][Records.KEY]; // all zero: everything in the last part
        }
        byte[][] out = new byte[parts - 1][];
        for (int j = 1; j < parts; j++) {
            out[j - 1] = keys.get((int) ((long) keys.size() * j / parts));
        }
        return out;
    }

    /** Partition i holds the keys k with splits[i-1] <= k < splits[i]. */
    static final class KeyPartitioner extends Partitioner {
        private static final long serialVersionUID = 1L;
        private final byte[][] splits;

        KeyPartitioner(byte[][] splits) {
            this.splits = splits;
        }

        @Override
        public int numPartitions() {
            return splits.length + 1;
        }

        @Override
        public int getPartition(Object key) {
            byte[] record = (byte[]) key;
            int lo = 0;
            int hi = splits.length;
            while (lo < hi) {
                int mid = (lo + hi) >>> 1;
                if (Records.compareKeys(record, 0, splits[mid], 0) < 0) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            return lo;
        }
    }

    /** Write the sorted records of partition i to dir/part-i; {records}. */
    static Iterator<long[]> write(String dir, int i, Iterator<Tuple2<byte[], Object>> it)
            throws IOException {
        Path path = new Path(dir, TeraSort.partName(i));
        long n = 0;
        try (OutputStream os = new BufferedOutputStream(
                TeraSort.fs(path).create(path, true), 1 << 20)) {
            while (it.hasNext()) {
                os.write(it.next()._1());
                n++;
            }
        }
        return Collections.singletonList(new long[] {n}).iterator();
    }
}
