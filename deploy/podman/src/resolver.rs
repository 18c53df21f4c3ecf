//! The sandbox's resolver: a UDP DNS server on the host end of its network
//! that refuses every query at once and keeps the names asked. A harness that
//! looks up a vendor's host (a login, telemetry, a model list) fails at once
//! instead of waiting on a nameserver it cannot reach, and the attempt's
//! record names what it asked for.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// At most this many questions are kept (a harness in a retry loop asks the
/// same few names again and again).
const KEPT: usize = 256;

/// A query's question: the name and the record type asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub name: String,
    pub kind: String,
}

impl std::fmt::Display for Question {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

/// The question of DNS query `query` and the REFUSED answer to it (same id,
/// opcode and recursion flag, the question echoed); `None` for what is not
/// one standard query with a readable question.
pub fn refuse(query: &[u8]) -> Option<(Question, Vec<u8>)> {
    let header = query.get(..12)?;
    let flags = u16::from_be_bytes([header[2], header[3]]);
    let questions = u16::from_be_bytes([header[4], header[5]]);
    if flags & 0x8000 != 0 || questions != 1 {
        return None; // an answer, or not one question
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = *query.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        // Compression pointers (0xC0) have no place in a query's question.
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).into_owned());
        at += len;
        if at > 12 + 255 {
            return None;
        }
    }
    let fixed = query.get(at..at + 4)?;
    let kind = match u16::from_be_bytes([fixed[0], fixed[1]]) {
        1 => "A".to_string(),
        5 => "CNAME".into(),
        12 => "PTR".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        28 => "AAAA".into(),
        33 => "SRV".into(),
        64 => "SVCB".into(),
        65 => "HTTPS".into(),
        n => format!("TYPE{n}"),
    };
    let end = at + 4;
    let mut answer = Vec::with_capacity(end);
    answer.extend_from_slice(&header[..2]);
    // QR (an answer), the query's opcode and RD, RA, RCODE 5 (refused).
    let answer_flags = 0x8000 | (flags & 0x7800) | (flags & 0x0100) | 0x0080 | 5;
    answer.extend_from_slice(&answer_flags.to_be_bytes());
    answer.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    answer.extend_from_slice(&query[12..end]);
    let name = if labels.is_empty() {
        ".".into()
    } else {
        labels.join(".")
    };
    Some((Question { name, kind }, answer))
}

/// A refusing resolver on one address, until [`Resolver::stop`].
#[derive(Debug)]
pub struct Resolver {
    pub addr: SocketAddr,
    asked: Arc<Mutex<Vec<Question>>>,
    task: JoinHandle<()>,
}

impl Resolver {
    /// Listens on `ip`:53/udp.
    pub async fn start(ip: Ipv4Addr) -> std::io::Result<Resolver> {
        let socket = UdpSocket::bind((ip, 53)).await?;
        let addr = socket.local_addr()?;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(serve(socket, asked.clone()));
        Ok(Resolver { addr, asked, task })
    }

    /// The questions asked so far, in order (the first [`KEPT`]).
    pub fn asked(&self) -> Vec<Question> {
        self.asked.lock().map(|a| a.clone()).unwrap_or_default()
    }

    pub fn stop(self) -> Vec<Question> {
        self.task.abort();
        self.asked()
    }
}

async fn serve(socket: UdpSocket, asked: Arc<Mutex<Vec<Question>>>) {
    let mut buf = [0u8; 1500];
    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
        let Some((question, answer)) = refuse(&buf[..n]) else {
            continue;
        };
        if let Ok(mut asked) = asked.lock() {
            if asked.len() < KEPT {
                asked.push(question);
            }
        }
        let _ = socket.send_to(&answer, from).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query as a resolver library writes it: id, RD, one question.
    fn query(id: u16, name: &str, kind: u16) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&kind.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn a_query_is_refused_with_its_id_and_question() {
        let q = query(0xbeef, "api.openai.com", 28);
        let (question, answer) = refuse(&q).unwrap();
        assert_eq!(question.to_string(), "AAAA api.openai.com");
        assert_eq!(&answer[..2], &[0xbe, 0xef]);
        let flags = u16::from_be_bytes([answer[2], answer[3]]);
        assert_eq!(flags & 0x8000, 0x8000, "an answer");
        assert_eq!(flags & 0x000f, 5, "REFUSED");
        assert_eq!(flags & 0x0100, 0x0100, "RD echoed");
        assert_eq!(&answer[4..12], &[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&answer[12..], &q[12..]);
    }

    #[test]
    fn what_is_not_one_readable_question_gets_no_answer() {
        let q = query(1, "example.com", 1);
        assert!(refuse(&q[..11]).is_none(), "short header");
        assert!(refuse(&q[..q.len() - 1]).is_none(), "cut in the question");
        let mut answer = q.clone();
        answer[2] |= 0x80;
        assert!(refuse(&answer).is_none(), "an answer is not a query");
        let mut pointer = q.clone();
        pointer[12] = 0xc0;
        assert!(refuse(&pointer).is_none(), "a compression pointer");
        let mut two = q;
        two[5] = 2;
        assert!(refuse(&two).is_none(), "two questions");
        let long = query(1, &vec!["a".repeat(63); 5].join("."), 1);
        assert!(refuse(&long).is_none(), "a name over 255 bytes");
        assert!(refuse(&[]).is_none());
    }

    #[tokio::test]
    async fn the_resolver_answers_at_once_and_keeps_the_names() {
        // Port 53 needs root, as sandbox networks do; an address of its own
        // on loopback keeps clear of a resolver this host runs.
        let resolver = Resolver::start(Ipv4Addr::new(127, 0, 53, 9))
            .await
            .expect("a resolver on 127.0.53.9:53 (needs root)");
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for (i, name) in ["telemetry.example.com", "models.example.com"]
            .iter()
            .enumerate()
        {
            client
                .send_to(&query(i as u16, name, 1), resolver.addr)
                .await
                .unwrap();
            let mut buf = [0u8; 512];
            let (n, _) = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                client.recv_from(&mut buf),
            )
            .await
            .unwrap()
            .unwrap();
            assert_eq!(buf[3] & 0x0f, 5, "refused");
            assert_eq!(&buf[..2], &(i as u16).to_be_bytes());
            assert!(n > 12);
        }
        let asked: Vec<String> = resolver.stop().iter().map(|q| q.to_string()).collect();
        assert_eq!(asked, ["A telemetry.example.com", "A models.example.com"]);
    }
}
