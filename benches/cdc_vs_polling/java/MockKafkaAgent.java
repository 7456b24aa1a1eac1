// A Java agent for running Kafka's Java clients (4.x) against librdkafka's mock cluster, which
// the benchmark's Debezium + Kafka Connect runs use (benches/cdc_vs_polling/debezium.rs).
//
// The mock answers ApiVersions v4 with a body the Java client reads as a throttle time of about
// 20 minutes, so every client stalls right after connecting. This agent makes
// org.apache.kafka.common.requests.ApiVersionsResponse.shouldClientThrottle(short) return false
// (rewritten with javassist, which the Debezium wheel ships) and changes nothing else. Not used
// against a real broker (--broker tansu or HOST:PORT).
//
// Built by the benchmark: javac -cp javassist.jar, then a jar with "Premain-Class: MockKafkaAgent".

import java.io.ByteArrayInputStream;
import java.lang.instrument.ClassFileTransformer;
import java.lang.instrument.Instrumentation;
import java.security.ProtectionDomain;
import javassist.ClassPool;
import javassist.CtClass;
import javassist.LoaderClassPath;

public class MockKafkaAgent {
    static final String TARGET = "org/apache/kafka/common/requests/ApiVersionsResponse";

    public static void premain(String args, Instrumentation inst) {
        inst.addTransformer(new ClassFileTransformer() {
            @Override
            public byte[] transform(ClassLoader loader, String name, Class<?> redefined, ProtectionDomain pd, byte[] bytes) {
                if (!TARGET.equals(name)) return null;
                try {
                    ClassPool pool = new ClassPool(true);
                    if (loader != null) pool.appendClassPath(new LoaderClassPath(loader));
                    CtClass c = pool.makeClass(new ByteArrayInputStream(bytes));
                    c.getDeclaredMethod("shouldClientThrottle").setBody("{ return false; }");
                    byte[] out = c.toBytecode();
                    c.detach();
                    System.err.println("MockKafkaAgent: patched ApiVersionsResponse.shouldClientThrottle");
                    return out;
                } catch (Throwable t) {
                    System.err.println("MockKafkaAgent: could not patch " + name + ": " + t);
                    return null;
                }
            }
        });
    }
}
