//! `wire-probe SOCKET`: connects to a bus socket, sends a Hello, and prints
//! what came back as one line: `hello_ack bus_pid=N`, `error CODE message`,
//! `closed`, or `connect_error <reason>` (exit 1). Tests run it as another
//! user to check the bus's peer-uid check.

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    process::ExitCode,
    time::Duration,
};

use prost::Message;
use proto::v1::{client_frame, server_frame, ClientFrame, ErrorCode, Hello, ServerFrame};

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: wire-probe SOCKET");
        return ExitCode::from(2);
    };
    let mut s = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            println!("connect_error {e}");
            return ExitCode::from(1);
        }
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let hello = ClientFrame {
        kind: Some(client_frame::Kind::Hello(Hello {
            protocol_version: proto::PROTOCOL_VERSION,
            client_pid: std::process::id(),
            client_name: "wire-probe".into(),
            build: String::new(),
        })),
    };
    let mut buf = bytes::BytesMut::new();
    if proto::encode_frame(&hello, &mut buf).is_err() || s.write_all(&buf).is_err() {
        println!("closed");
        return ExitCode::SUCCESS;
    }
    let mut len = [0u8; 4];
    if s.read_exact(&mut len).is_err() {
        println!("closed");
        return ExitCode::SUCCESS;
    }
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    if s.read_exact(&mut body).is_err() {
        println!("closed");
        return ExitCode::SUCCESS;
    }
    match ServerFrame::decode(body.as_slice()).map(|f| f.kind) {
        Ok(Some(server_frame::Kind::HelloAck(a))) => println!("hello_ack bus_pid={}", a.bus_pid),
        Ok(Some(server_frame::Kind::Error(e))) => {
            let code = ErrorCode::try_from(e.code).unwrap_or(ErrorCode::Unspecified);
            println!("error {} {}", code.as_str_name(), e.message);
        }
        Ok(other) => println!("other {other:?}"),
        Err(e) => println!("undecodable {e}"),
    }
    ExitCode::SUCCESS
}
