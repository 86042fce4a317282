package hpvc.terasort;

import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * hpvc's TeraSort for Spark: one application, three commands.
 *
 * <pre>
 *   gen ROWS OUT [--partitions N]    write ROWS gensort records, one file per partition
 *   sort IN OUT [--partitions N]     range-partition on the key, sort, one file per partition
 *   validate IN                      sortedness, record count and checksum of IN
 *   all ROWS DIR [--partitions N]    gen into DIR/in, sort into DIR/out, validate DIR/out
 * </pre>
 *
 * Paths are Hadoop paths: a plain path or file:// is the local file system and
 * must be the same folder for the driver and every executor (shared storage,
 * or one host). All per-record work stays in the JVM. Each command prints one
 * result line (TERAGEN, TERASORT, TERAVALIDATE) and one TERATIME line of
 * key=value fields on stdout; times are seconds, checksums hexadecimal.
 * {@code all} runs the three in one application, so the driver and the
 * executors start once (a job's whole TeraSort; under emulation each start
 * costs tens of seconds), printing each one's lines.
 */
public final class TeraSort {
    static final long TARGET_PARTITION_BYTES = 64L << 20;

    private TeraSort() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            usage("missing arguments");
        }
        String cmd = args[0];
        SparkConf conf = new SparkConf().setAppName("hpvc-terasort-" + cmd);
        conf.setIfMissing("spark.serializer", "org.apache.spark.serializer.KryoSerializer");
        int status;
        long jvmStart = ManagementFactory.getRuntimeMXBean().getStartTime();
        try (JavaSparkContext sc = new JavaSparkContext(conf)) {
            double startup = (System.currentTimeMillis() - jvmStart) / 1000.0;
            if (cmd.equals("all")) {
                status = all(sc, args, startup);
                System.out.flush();
                if (status != 0) {
                    System.exit(status);
                }
                return;
            }
            Timer timer = new Timer(cmd, startup);
            switch (cmd) {
                case "gen":
                    status = Gen.run(sc, Long.parseLong(args[1]), target(args, 2),
                            partitions(args, 3), timer);
                    break;
                case "sort":
                    status = Sort.run(sc, args[1], target(args, 2), partitions(args, 3), timer);
                    break;
                case "validate":
                    status = Validate.run(sc, args[1], timer);
                    break;
                default:
                    usage("unknown command " + cmd);
                    return;
            }
            timer.print();
        }
        System.out.flush();
        if (status != 0) {
            System.exit(status);
        }
    }

    /** {@code all ROWS DIR [--partitions N]}: gen, sort and validate in one application. */
    private static int all(JavaSparkContext sc, String[] args, double startup) throws Exception {
        long rows = Long.parseLong(args[1]);
        String dir = target(args, 2);
        int asked = partitions(args, 3);
        String in = dir + "/in";
        String out = dir + "/out";
        Timer gen = new Timer("gen", startup);
        int status = Gen.run(sc, rows, in, asked, gen);
        gen.print();
        if (status == 0) {
            Timer sort = new Timer("sort", 0.0);
            status = Sort.run(sc, in, out, asked, sort);
            sort.print();
        }
        if (status == 0) {
            Timer validate = new Timer("validate", 0.0);
            status = Validate.run(sc, out, validate);
            validate.print();
        }
        return status;
    }

    private static String target(String[] args, int at) {
        if (args.length <= at) {
            usage("missing the output path");
        }
        return args[at];
    }

    /** {@code --partitions N} at args[at..], or 0 (choose from the size). */
    private static int partitions(String[] args, int at) {
        if (args.length == at) {
            return 0;
        }
        if (args.length == at + 2 && args[at].equals("--partitions")) {
            int n = Integer.parseInt(args[at + 1]);
            if (n > 0) {
                return n;
            }
        }
        usage("unexpected arguments " + Arrays.toString(Arrays.copyOfRange(args, at, args.length)));
        return 0;
    }

    private static void usage(String why) {
        System.err.println("terasort: " + why);
        System.err.println("usage: gen ROWS OUT [--partitions N] | sort IN OUT [--partitions N]"
                + " | validate IN | all ROWS DIR [--partitions N]");
        System.exit(2);
    }

    /** Partitions for {@code bytes} of records: 64 MiB each, at least one per core. */
    static int partitionsFor(JavaSparkContext sc, long bytes, int asked) {
        if (asked > 0) {
            return asked;
        }
        long bySize = (bytes + TARGET_PARTITION_BYTES - 1) / TARGET_PARTITION_BYTES;
        return (int) Math.max(sc.defaultParallelism(), Math.min(bySize, 100_000));
    }

    /** The file system of {@code path}; the local one without .crc side files. */
    static FileSystem fs(Path path) throws IOException {
        FileSystem fs = path.getFileSystem(new Configuration());
        return fs instanceof LocalFileSystem ? ((LocalFileSystem) fs).getRaw() : fs;
    }

    /** OUT as a new, empty folder; an error if it holds anything. */
    static Path freshDir(String out) throws IOException {
        Path path = new Path(out);
        FileSystem fs = fs(path);
        if (fs.exists(path) && fs.listStatus(path).length > 0) {
            throw new IOException(out + " exists and is not empty (remove it first)");
        }
        fs.mkdirs(path);
        return fs.makeQualified(path);
    }

    /** The data files of IN (no hidden or _ files), sorted by name: the partition order. */
    static List<String> dataFiles(String in) throws IOException {
        Path path = new Path(in);
        FileSystem fs = fs(path);
        List<String> out = new ArrayList<>();
        for (FileStatus st : fs.listStatus(path)) {
            String name = st.getPath().getName();
            if (st.isFile() && !name.startsWith(".") && !name.startsWith("_")) {
                out.add(fs.makeQualified(st.getPath()).toString());
            }
        }
        out.sort(null);
        if (out.isEmpty()) {
            throw new IOException(in + " holds no data files");
        }
        return out;
    }

    static long totalLength(List<String> files) throws IOException {
        long total = 0;
        for (String f : files) {
            Path p = new Path(f);
            total += fs(p).getFileStatus(p).getLen();
        }
        return total;
    }

    static String partName(int index) {
        return String.format(Locale.ROOT, "part-%05d", index);
    }

    static String hex(BigInteger v) {
        return v.toString(16);
    }

    /** Sum of unsigned per-partition sums, as valsort adds per-record CRC32s (128-bit). */
    static BigInteger sumUnsigned(long[] sums) {
        BigInteger total = BigInteger.ZERO;
        for (long s : sums) {
            total = total.add(new BigInteger(Long.toUnsignedString(s)));
        }
        return total;
    }

    /** Times of the phases of one command, printed as one TERATIME line. */
    static final class Timer {
        private final StringBuilder line = new StringBuilder();
        private final long start = System.nanoTime();
        private long last = start;

        Timer(String cmd, double startupSeconds) {
            line.append("TERATIME cmd=").append(cmd);
            field("startup_s", startupSeconds);
        }

        private void field(String name, double seconds) {
            line.append(' ').append(name).append('=')
                    .append(String.format(Locale.ROOT, "%.3f", seconds));
        }

        /** End the phase {@code name} now. */
        void phase(String name) {
            long now = System.nanoTime();
            field(name + "_s", (now - last) / 1e9);
            last = now;
        }

        void print() {
            field("total_s", (System.nanoTime() - start) / 1e9);
            System.out.println(line);
        }
    }
}
