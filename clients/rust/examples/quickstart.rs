use timerdb_client::{pb, Client, Connector, SubscriptionOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addrs = std::env::var("TIMERDB_ADDRS")
        .unwrap_or_else(|_| "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".into());
    let addrs: Vec<&str> = addrs.split(',').collect();
    // Any nodes: the client finds the leader, and retries what is safe to retry.
    let client = Client::connect(Connector::new(), &addrs).await?;
    let id = format!("invoice-{}", std::process::id());
    let r = client
        .schedule(pb::ScheduleRequest {
            namespace: "billing".into(),
            id: id.clone(),
            when: Some(pb::schedule_request::When::DelayMs(1_000)),
            payload: br#"{"customer": 7}"#.to_vec(),
            content_type: "application/json".into(),
            ..Default::default()
        })
        .await?;
    println!("scheduled {} (created: {})", id, r.created);
    // A consumer: resubscribes through another node if one fails, acks in batches.
    let mut sub = client.subscribe("billing", SubscriptionOptions::default());
    while let Some(delivery) = sub.next().await {
        let delivery = delivery?;
        let timer = delivery.timer.clone().unwrap_or_default();
        println!("fired: {} (attempt {})", timer.id, delivery.attempt);
        sub.ack(&delivery);
        if timer.id == id {
            break;
        }
    }
    println!("acked: {:?}", sub.flush().await.acked);
    Ok(())
}
