package hpvc.terasort;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.util.List;
import java.util.zip.CRC32;
import org.apache.hadoop.fs.Path;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * {@code validate IN}: every file of IN (in name order: the partition order)
 * sorted, each file's last key <= the next non-empty file's first key; the
 * record count and the checksum: the sum of every record's CRC32 as a 128-bit
 * number, which is what gensort -c and valsort print, so a sort that loses,
 * duplicates or changes a record shows. Exit status 1 when not sorted.
 */
final class Validate {
    private static final int CHUNK_RECORDS = 4096;

    private Validate() {}

    /** What one file holds. */
    static final class Part implements Serializable {
        private static final long serialVersionUID = 1L;
        long records;
        long crcSum;
        byte[] first;
        byte[] last;
        String problem; // null when sorted and whole
    }

    static int run(JavaSparkContext sc, String in, TeraSort.Timer timer) throws IOException {
        List<String> files = TeraSort.dataFiles(in);
        List<Part> parts = sc.parallelize(files, files.size()).map(Validate::check).collect();
        timer.phase("validate");
        long records = 0;
        long[] sums = new long[parts.size()];
        String problem = null;
        byte[] previous = null;
        for (int i = 0; i < parts.size(); i++) {
            Part p = parts.get(i);
            records += p.records;
            sums[i] = p.crcSum;
            String name = new Path(files.get(i)).getName();
            if (problem == null && p.problem != null) {
                problem = name + ":" + p.problem;
            }
            if (p.records == 0) {
                continue;
            }
            if (problem == null && previous != null
                    && Records.compareKeys(previous, 0, p.first, 0) > 0) {
                problem = name + ":first-key-below-previous-part";
            }
            previous = p.last;
        }
        boolean sorted = problem == null;
        System.out.printf("TERAVALIDATE records=%d checksum=%s sorted=%s partitions=%d%s%n",
                records, TeraSort.hex(TeraSort.sumUnsigned(sums)), sorted, files.size(),
                sorted ? "" : " problem=" + problem);
        return sorted ? 0 : 1;
    }

    /** Read one file through: count, CRC sum, first and last key, first disorder. */
    static Part check(String file) throws IOException {
        Path path = new Path(file);
        Part part = new Part();
        byte[] buf = new byte[CHUNK_RECORDS * Records.SIZE];
        byte[] last = null;
        CRC32 crc = new CRC32();
        try (InputStream is = TeraSort.fs(path).open(path)) {
            int n;
            while ((n = readRecords(is, buf)) > 0) {
                for (int r = 0; r < n; r++) {
                    int off = r * Records.SIZE;
                    part.crcSum += Records.crc(crc, buf, off);
                    if (last == null) {
                        part.first = java.util.Arrays.copyOfRange(buf, off, off + Records.KEY);
                        last = new byte[Records.KEY];
                    } else if (part.problem == null
                            && Records.compareKeys(last, 0, buf, off) > 0) {
                        part.problem = "unsorted-at-record-" + (part.records + r);
                    }
                    System.arraycopy(buf, off, last, 0, Records.KEY);
                }
                part.records += n;
            }
        } catch (EOFException e) {
            part.problem = "length-not-a-multiple-of-100";
        }
        part.last = last;
        return part;
    }

    /** Fill buf with whole records; how many (0 at the end). EOFException on a partial one. */
    private static int readRecords(InputStream is, byte[] buf) throws IOException {
        int got = 0;
        while (got < buf.length) {
            int r = is.read(buf, got, buf.length - got);
            if (r < 0) {
                break;
            }
            got += r;
        }
        if (got % Records.SIZE != 0) {
            throw new EOFException();
        }
        return got / Records.SIZE;
    }
}
