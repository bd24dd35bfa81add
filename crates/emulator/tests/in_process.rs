//! The in-process client under tokio's paused time: requests and watches work, and virtual time
//! moves only when everything waits for a timer.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kactor_emulator::{samples, Emulator};
use kube::api::{PostParams, WatchEvent, WatchParams};

#[tokio::test(start_paused = true)]
async fn requests_and_watches_work_in_memory_under_paused_time() {
    let emulator = Emulator::start().await.unwrap();
    let client = emulator.in_process_client();
    let widgets = samples::install_widgets(&client).await.unwrap();
    let started = tokio::time::Instant::now();

    let list = widgets.list(&Default::default()).await.unwrap();
    assert!(list.items.is_empty());
    let version = list.metadata.resource_version.unwrap();
    let mut events = widgets
        .watch(&WatchParams::default().timeout(290), &version)
        .await
        .unwrap()
        .boxed();
    let body = serde_json::from_value(samples::widget("w1", 3)).unwrap();
    widgets.create(&PostParams::default(), &body).await.unwrap();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Added(object)) => {
            assert_eq!(object.metadata.name.as_deref(), Some("w1"));
        }
        other => panic!("expected the creation, got {other:?}"),
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no timer fired: the clock stood still while requests were answered"
    );

    // An hour passes at once; the watch ends at its server-side timeout, as it would.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let rest: Vec<_> = events.collect().await;
    assert!(
        rest.iter()
            .all(|e| matches!(e, Ok(WatchEvent::Bookmark(_)))),
        "only bookmarks after the creation: {rest:?}"
    );
    let object = widgets.get("w1").await.unwrap();
    assert_eq!(object.data["spec"]["size"], 3);
    assert_eq!(started.elapsed(), Duration::from_secs(3600));
}
