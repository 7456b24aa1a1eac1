//! The webhook sink's endpoint in the benchmark: an HTTP/1.1 receiver (hyper, keep-alive) on
//! 127.0.0.1 in this process, on a thread and current-thread runtime of its own (the load
//! generator's tasks never delay it), that answers `200` at once and records, per request, the
//! event id (`id` header) and the instant the request arrived — the "consumer" end of the
//! pipeline for the webhook sink, so commit→endpoint latency is measured like commit→consumer
//! for the brokers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::consumer::Receipt;

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    port: u16,
    receipts: Arc<Mutex<Vec<Receipt>>>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    pub fn start() -> Result<Receiver> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding the webhook receiver")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let receipts = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, flag) = (Arc::clone(&receipts), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("bench-webhook-receiver".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    eprintln!("bench webhook receiver: no runtime");
                    return;
                };
                runtime.block_on(serve(listener, sink, flag));
            })?;
        Ok(Receiver { port, receipts, stop })
    }

    /// The relay's `[webhook] url`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/${{topic}}", self.port)
    }

    /// The receipts so far, taken (the next call returns only newer ones).
    pub fn take(&self) -> Vec<Receipt> {
        std::mem::take(&mut *self.receipts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn serve(listener: std::net::TcpListener, receipts: Arc<Mutex<Vec<Receipt>>>, stop: Arc<AtomicBool>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        eprintln!("bench webhook receiver: cannot listen");
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        let Ok(Ok((stream, _))) = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let receipts = Arc::clone(&receipts);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let receipts = Arc::clone(&receipts);
                async move {
                    let at = Instant::now();
                    let id = req
                        .headers()
                        .get("id")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<i64>().ok());
                    // Read the body to its end: the connection is then reused.
                    let _ = req.into_body().collect().await;
                    if let Some(id) = id {
                        receipts.lock().unwrap_or_else(|e| e.into_inner()).push((id, at));
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
