#!/usr/bin/env node
// A small rhea client for hastandby's integration tests: send N messages to a
// queue and wait for each to be accepted, then receive N (accepting each).
//
//   node client.js --url amqp://127.0.0.1:5672 --queue q --send 10 --receive 10
//   node client.js --url amqps://localhost:5671 --ca ca.pem --queue q --send 10
//   node client.js --url amqps://localhost:5671 --ca ca.pem --cert c.pem --key c.key --receive 1
//
// Credentials: --user/--password, or HASTANDBY_USER/HASTANDBY_PASSWORD (rhea
// then uses SASL PLAIN); no user: SASL ANONYMOUS, or EXTERNAL with a client
// certificate.  TLS (amqps://): --ca verifies the node's certificate and host
// name, --cert/--key present a client certificate.  Prints one JSON line
// {"sent", "accepted", "received", "bodies", "error"} and exits 0, or 1 with
// "error" set (the peer's condition and description), or 2 on a bad command
// line.  --timeout (seconds) bounds the whole run.  --message-ids yes gives each
// message sent its body as message-id (duplicate detection).  --property NAME
// --values N gives message i the application property NAME = "v" + (i % N)
// (last-value queues, message groups).  --priority-from N gives message i the
// header priority (N + i) % 10 (priority queues).  Receiving: --consumers N
// opens N receivers on the queue, in attach order, each given --receive
// credit, and stops once --receive messages came to them all together;
// --outcome accept (default), release, fail (modified with delivery-failed:
// counts toward a delivery limit), reject or none (left unsettled, held:
// message groups).  The JSON line then also has "consumers" (which receiver,
// 0-based, got each message), "delivery_counts" (each message's header
// delivery-count) and "annotations" (each message's message annotations).
'use strict';

const fs = require('fs');
const rhea = require('rhea');

function parse(argv) {
  const options = {
    url: 'amqp://127.0.0.1:5672', queue: 'rhea', send: 0, receive: 0, timeout: 20,
    user: process.env.HASTANDBY_USER, password: process.env.HASTANDBY_PASSWORD,
    ca: undefined, cert: undefined, key: undefined, prefix: 'rhea-', 'message-ids': 'no',
    property: undefined, values: 1, 'priority-from': undefined, consumers: 1, outcome: 'accept',
  };
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    const value = argv[i + 1];
    if (!(name in options) || value === undefined) {
      throw new Error(`unknown option or missing value: ${argv[i]}`);
    }
    options[name] = ['send', 'receive', 'timeout', 'values', 'priority-from', 'consumers'].includes(name)
      ? Number(value) : value;
  }
  if (!['accept', 'release', 'fail', 'reject', 'none'].includes(options.outcome)) {
    throw new Error(`--outcome must be accept, release, fail, reject or none, got ${options.outcome}`);
  }
  return options;
}

function connectOptions(options) {
  const url = new URL(options.url);
  const tls = url.protocol === 'amqps:';
  const connect = {
    host: url.hostname, port: Number(url.port) || (tls ? 5671 : 5672),
    reconnect: false, idle_time_out: 0, container_id: `rhea-test-${process.pid}`,
  };
  if (options.user) {
    connect.username = options.user;
    if (options.password !== undefined) connect.password = options.password;
  } else if (!options.cert) {
    connect.username = 'anonymous'; // rhea: a user without a password means SASL ANONYMOUS
  }
  if (tls) {
    connect.transport = 'tls';
    connect.servername = url.hostname;
    if (options.ca) connect.ca = [fs.readFileSync(options.ca)];
    if (options.cert) {
      connect.cert = fs.readFileSync(options.cert);
      connect.enable_sasl_external = !options.user; // no user: EXTERNAL, as the certificate's subject
    }
    if (options.key) connect.key = fs.readFileSync(options.key);
    connect.rejectUnauthorized = true;
  }
  return connect;
}

function describe(error) {
  if (!error) return 'unknown error';
  if (error.condition || error.description) return `${error.condition || ''}: ${error.description || ''}`.trim();
  return error.message || String(error);
}

function run(options) {
  const result = { sent: 0, accepted: 0, received: 0, bodies: [], error: null, consumers: [], delivery_counts: [],
                   annotations: [] };
  const container = rhea.create_container();
  let connection;
  let finished = false;

  const finish = (error) => {
    if (finished) return;
    finished = true;
    if (error) result.error = error;
    process.stdout.write(JSON.stringify(result) + '\n');
    const code = result.error ? 1 : 0;
    if (connection && connection.is_open()) {
      connection.once('connection_close', () => process.exit(code));
      connection.close();
      setTimeout(() => process.exit(code), 2000).unref();
    } else {
      process.exit(code);
    }
  };
  setTimeout(() => finish(`timed out after ${options.timeout} s (sent ${result.sent}, ` +
                          `accepted ${result.accepted}, received ${result.received})`),
             options.timeout * 1000).unref();

  const startReceiving = () => {
    if (options.receive <= 0) return finish();
    for (let index = 0; index < options.consumers; index += 1) {
      const receiver = connection.open_receiver({ source: options.queue, autoaccept: false, credit_window: 0 });
      receiver.add_credit(options.receive);
      receiver.on('message', (context) => {
        if (result.received >= options.receive) return; // beyond what was asked: left unsettled
        result.received += 1;
        result.bodies.push(context.message.body);
        result.consumers.push(index);
        result.delivery_counts.push(context.message.delivery_count || 0);
        result.annotations.push(context.message.message_annotations || {});
        const delivery = context.delivery;
        if (options.outcome === 'accept') delivery.accept();
        else if (options.outcome === 'release') delivery.release();
        else if (options.outcome === 'fail') delivery.modified({ delivery_failed: true, undeliverable_here: false });
        else if (options.outcome === 'reject') delivery.reject();
        if (result.received === options.receive) setTimeout(() => finish(), 100); // the dispositions go out first
      });
      receiver.on('receiver_error', (context) => finish(`receiver: ${describe(context.receiver.error)}`));
    }
  };

  container.on('connection_open', () => {
    if (options.send <= 0) return startReceiving();
    const sender = connection.open_sender({ target: options.queue });
    let next = 0;
    const pump = () => {
      while (next < options.send && sender.sendable()) {
        const message = { body: `${options.prefix}${next}` };
        if (options['message-ids'] === 'yes') message.message_id = message.body; // --message-ids yes: id = body
        if (options.property) message.application_properties = { [options.property]: `v${next % options.values}` };
        if (options['priority-from'] !== undefined) message.priority = (options['priority-from'] + next) % 10;
        sender.send(message);
        next += 1;
        result.sent += 1;
      }
    };
    sender.on('sendable', pump);
    sender.on('accepted', () => {
      result.accepted += 1;
      if (result.accepted === options.send) startReceiving();
    });
    sender.on('rejected', (context) => finish(`rejected: ${describe(context.delivery.remote_state &&
                                                                    context.delivery.remote_state.error)}`));
    sender.on('released', () => finish('released'));
    sender.on('sender_error', (context) => finish(`sender: ${describe(context.sender.error)}`));
  });
  container.on('connection_error', (context) => finish(`connection: ${describe(context.error ||
                                                                              context.connection.get_error())}`));
  container.on('protocol_error', (context) => finish(`protocol: ${describe(context.error || context)}`));
  container.on('error', (context) => finish(`error: ${describe(context.error || context)}`));
  container.on('disconnected', (context) => {
    if (!finished) finish(`disconnected: ${describe(context.error || (context.connection && context.connection.error))}`);
  });
  connection = container.connect(connectOptions(options));
}

let options;
try {
  options = parse(process.argv.slice(2));
} catch (error) {
  process.stderr.write(`client.js: ${error.message}\n`);
  process.exit(2);
}
run(options);
