// Runs Debezium 3.6's PostgreSQL connector (embedded engine) on an outbox table and writes, for
// every change event and every requested variant, the Kafka record that Kafka Connect would
// produce: the Outbox EventRouter applied with the variant's SMT options, then the key, value and
// header converters applied exactly as Connect's WorkerSourceTask applies them
// (converter.fromConnectData(topic, headers, schema, value); headerConverter.fromConnectHeader
// per header), the partition as Connect's producer picks it (the record's own partition, else the
// Java producer's murmur2 of the key bytes).
//
// Used by the conformance tests (tests/it/debezium/) and nothing else. Compiled with javac at test
// time against the jars of scripts/install-debezium.sh.
//
// Usage: java -cp <libs/*>:<classes> DebeziumOutbox SPEC_JSON OUT_JSONL
//   SPEC_JSON: {"connector": {Debezium connector properties}, "records": N, "partitions": P,
//               "variants": [{"name": "...", "smt": {EventRouter options},
//                             "converters": {"key.converter": ..., "value.converter": ..., ...}}]}
// Prints "READY" on stdout once the connector task runs (its slot exists, so every row committed
// afterwards is captured), and "DONE <n>" once N change events have been written.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.debezium.embedded.Connect;
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.transforms.outbox.EventRouter;
import java.io.FileWriter;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.HeaderConverter;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;

public class DebeziumOutbox {
    static final ObjectMapper JSON = new ObjectMapper();

    /** One EventRouter configuration with one key/value/header converter combination. */
    static final class Variant {
        final String name;
        final EventRouter<SourceRecord> router;
        final Converter key;
        final Converter value;
        final HeaderConverter header;

        Variant(JsonNode spec) throws Exception {
            name = spec.get("name").asText();
            router = new EventRouter<>();
            router.configure(strings(spec.get("smt")));
            Map<String, String> conv = strings(spec.get("converters"));
            key = converter(conv, "key.converter", true);
            value = converter(conv, "value.converter", false);
            header = new SimpleHeaderConverter();
            header.configure(new HashMap<>());
        }
    }

    static Map<String, String> strings(JsonNode node) {
        Map<String, String> out = new HashMap<>();
        if (node == null) return out;
        Iterator<Map.Entry<String, JsonNode>> it = node.fields();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> e = it.next();
            out.put(e.getKey(), e.getValue().asText());
        }
        return out;
    }

    /** A converter configured as Connect configures a worker's `key.converter.*` / `value.converter.*`. */
    static Converter converter(Map<String, String> conv, String prefix, boolean isKey) throws Exception {
        String cls = conv.getOrDefault(prefix, "org.apache.kafka.connect.json.JsonConverter");
        Converter c = (Converter) Class.forName(cls).getDeclaredConstructor().newInstance();
        Map<String, String> props = new HashMap<>();
        for (Map.Entry<String, String> e : conv.entrySet()) {
            if (e.getKey().startsWith(prefix + ".")) props.put(e.getKey().substring(prefix.length() + 1), e.getValue());
        }
        c.configure(props, isKey);
        return c;
    }

    static String hex(byte[] bytes) {
        return bytes == null ? null : HexFormat.of().formatHex(bytes);
    }

    /** The record Connect would produce for `raw` under `v`, or the error that stops Connect's task. */
    static ObjectNode produce(Variant v, SourceRecord raw, int partitions) {
        ObjectNode out = JSON.createObjectNode();
        out.put("variant", v.name);
        try {
            // Each variant gets its own copy: the EventRouter adds its headers to the record it is given.
            SourceRecord copy = raw.newRecord(raw.topic(), raw.kafkaPartition(), raw.keySchema(), raw.key(),
                raw.valueSchema(), raw.value(), raw.timestamp(), raw.headers().duplicate());
            SourceRecord r = v.router.apply(copy);
            if (r == null) {
                out.put("dropped", true);
                return out;
            }
            RecordHeaders kafkaHeaders = new RecordHeaders();
            ArrayNode headers = out.putArray("headers");
            for (Header h : r.headers()) {
                byte[] bytes = v.header.fromConnectHeader(r.topic(), h.key(), h.schema(), h.value());
                ArrayNode pair = headers.addArray();
                pair.add(h.key());
                pair.add(hex(bytes));
                kafkaHeaders.add(h.key(), bytes);
            }
            byte[] key = v.key.fromConnectData(r.topic(), kafkaHeaders, r.keySchema(), r.key());
            byte[] value = v.value.fromConnectData(r.topic(), kafkaHeaders, r.valueSchema(), r.value());
            out.put("topic", r.topic());
            out.put("key", hex(key));
            out.put("value", hex(value));
            if (r.kafkaPartition() != null) {
                out.put("partition", r.kafkaPartition());
            } else if (key != null) {
                out.put("partition", Utils.toPositive(Utils.murmur2(key)) % partitions);
            } else {
                out.putNull("partition");
            }
        } catch (Throwable t) {
            out.put("error", t.getClass().getName() + ": " + t.getMessage());
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        JsonNode spec = JSON.readTree(Files.readString(Path.of(args[0])));
        int expected = spec.get("records").asInt();
        int partitions = spec.path("partitions").asInt(6);
        List<Variant> variants = new ArrayList<>();
        for (JsonNode v : spec.get("variants")) variants.add(new Variant(v));

        Properties props = new Properties();
        props.putAll(strings(spec.get("connector")));
        props.putIfAbsent("name", "outbox-conformance");
        props.putIfAbsent("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        props.putIfAbsent("offset.storage", "org.apache.kafka.connect.storage.MemoryOffsetBackingStore");
        props.putIfAbsent("offset.flush.interval.ms", "0");
        props.putIfAbsent("plugin.name", "pgoutput");
        props.putIfAbsent("snapshot.mode", "no_data");
        props.putIfAbsent("topic.prefix", "conformance");

        AtomicInteger seen = new AtomicInteger();
        CountDownLatch done = new CountDownLatch(1);
        PrintWriter out = new PrintWriter(new FileWriter(args[1]));
        DebeziumEngine<ChangeEvent<SourceRecord, SourceRecord>> engine = DebeziumEngine.create(Connect.class)
            .using(props)
            .using(new DebeziumEngine.ConnectorCallback() {
                @Override
                public void taskStarted() {
                    System.out.println("READY");
                    System.out.flush();
                }
            })
            .using((success, message, error) -> {
                if (!success) {
                    System.out.println("ENGINE FAILED: " + message + (error == null ? "" : " " + error));
                    System.out.flush();
                }
                done.countDown();
            })
            .notifying((records, committer) -> {
                for (ChangeEvent<SourceRecord, SourceRecord> event : records) {
                    if (seen.get() >= expected) break;
                    SourceRecord raw = event.value();
                    for (Variant v : variants) {
                        ObjectNode line = produce(v, raw, partitions);
                        line.put("seq", seen.get());
                        out.println(line.toString());
                    }
                    seen.incrementAndGet();
                    committer.markProcessed(event);
                }
                out.flush();
                committer.markBatchFinished();
                if (seen.get() >= expected) done.countDown();
            })
            .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        done.await();
        out.close();
        System.out.println("DONE " + seen.get());
        System.out.flush();
        engine.close();
        executor.shutdown();
        executor.awaitTermination(30, TimeUnit.SECONDS);
        System.exit(0);
    }
}
